"""BERT pretraining: loader (rank ranges, epoch order, collate), loop (per worker), job (stages)."""
