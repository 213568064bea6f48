"""BERT pretraining: loader (rank ranges, epoch order, collate), feed (a worker's batches), metrics (MLM/NSP
figures), worker (a worker's setup and resume), loop (per worker), init (model.init), job (stages)."""
