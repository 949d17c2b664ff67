"""DistributedDataParallel: one process per device, gradients all-reduced during backward."""
