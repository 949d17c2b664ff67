"""DistributedDataParallel: one process per device, gradients all-reduced during backward.

The course lab's functions come first: utils.py (Problems 1-3: run_process, initialize_group,
destroy_process), model.py (4: model_to_DDP), cifar10_loader.py (5: get_DDP_loader); each
works called the lab's way, and the harness calls the same ones with keyword extras.
ddp, ddp_dali, fsdp and pp all start this way. Who calls what, from the command line to
`fit` (paths under handler/):

    python train_cifar.py --mode ddp          this process spawns the ranks
      ../train_cifar.py   main: parse, validate, preflight, then modes.run_mode
      modes.py            run_mode: the mode's MODE.run, which is
      DDP/mode.py         launch(strategy)(cfg): build the Strategy, then
      DDP/utils.py        held_store: host the ranks' rendezvous store here, and
      DDP/utils.py        run_process(worker, cfg, ...): one process per device, each running
      DDP/run.py          worker(proc_id, cfg, strategy):
      DDP/utils.py          initialize_group: pick the device, join the process group
      train/trainer.py      fit: build_run (wrap: DDP/model.py model_to_DDP; loaders:
                            DDP/cifar10_loader.py get_DDP_loader, through data/loaders.py
                            lab_loaders), then the epochs
      DDP/utils.py          destroy_process, in `finally`

    torchrun --nproc_per_node N train_cifar.py --mode ddp     torchrun started every rank
      the same path, except that launch calls worker(0, ...) in this process instead of
      run_process, worker first prepares the data (run.py _torchrun_preparation), and
      initialize_group takes the rank and world from RANK, WORLD_SIZE and LOCAL_RANK.

Names: `dist` is handler/runtime/dist.py (the loop's collectives, no-ops without a group);
torch.distributed is imported as `tdist`.
"""
