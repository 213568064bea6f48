"""BERT in plain PyTorch."""
