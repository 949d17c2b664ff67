"""FullyShardedDataParallel (FSDP2): parameters, gradients and optimizer state are
sharded over the ranks; each stage all-gathers its parameters for forward and backward
and reduce-scatters its gradients."""
