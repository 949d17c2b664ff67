"""Pipeline parallelism: one slice of the model per process, micro-batches flowing through
the slices (torch.distributed.pipelining's PipelineStage and GPipe/1F1B schedules)."""
