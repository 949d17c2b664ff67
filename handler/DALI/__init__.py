"""NVIDIA DALI data path for --mode ddp_dali: the DDP training with batches from DALI pipelines."""
