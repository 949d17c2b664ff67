"""Pieces every mode shares: config, data, the training loop, checkpoints, metrics."""
