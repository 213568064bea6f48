"""Fine-tuning from a checkpoint: data (task readers), metrics, loop (per worker), job (driver)."""
