"""bench/overhead.py times blocks long enough that a block's fixed cost (two syncs, two
all-reduces read on the host) is a small share of it on a fast GPU step. docs/RESULTS.md."""
from bench import overhead


def test_a_fast_step_gets_a_block_of_at_least_the_target_duration():
    # A 3 ms GPU step: 5 steps would be 15 ms, so the fixed cost would bias the ratio.
    steps = overhead.block_steps(0.003, 5, 0.5)
    assert steps >= 167 and steps * 0.003 >= 0.5


def test_a_slow_step_keeps_the_minimum_block_and_no_step_time_is_bounded():
    assert overhead.block_steps(0.2, 5, 0.5) == 5  # a CPU step: 5 steps already last 1 s
    assert overhead.block_steps(0.0, 5, 0.5) == overhead.MAX_STEPS
    assert overhead.block_steps(1e-9, 5, 0.5) == overhead.MAX_STEPS


def test_cycled_batches_reuse_the_premade_tensors():
    batches = [object(), object()]
    longer = overhead.cycled(batches, 5)
    assert len(longer) == 5 and all(b is batches[i % 2] for i, b in enumerate(longer))


def test_a_ctrl_c_the_stop_flag_took_still_ends_the_bench():
    import os
    import signal
    import time

    import pytest
    import torch

    from handler.runtime.stopping import StopFlag
    stop = StopFlag()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the StopFlag's handler takes it, as in a real run
        while not stop.signum:
            time.sleep(0.01)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
        run = overhead.harness_block(model, overhead.fixed_batches(2, 4, torch.device("cpu")), torch.device("cpu"), stop)
        with pytest.raises(KeyboardInterrupt):
            run()
    finally:
        stop.close()
