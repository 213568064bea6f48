"""What pretraining and fine-tuning share: optimisation, precision, the train step, checkpoints, the launcher."""
