"""The training run reads as an outline (handler/train/trainer.py): `fit` stays short enough
to read at a glance, its set-up lives in build.py's `build_run`."""
import inspect

from handler.train import trainer

MAX_FIT_LINES = 40


def test_fit_stays_an_outline_of_at_most_forty_lines():
    lines = inspect.getsource(trainer.fit).splitlines()
    assert len(lines) <= MAX_FIT_LINES, (
        f"fit is {len(lines)} lines; move set-up into build_run (handler/train/build.py) or a "
        f"named step beside fit, so it stays at most {MAX_FIT_LINES}")


def test_fit_builds_its_run_in_one_call():
    # The set-up is one named step, not a preamble that grows back inside fit.
    source = inspect.getsource(trainer.fit)
    assert source.count("build_run(") == 1
    assert "build_model" not in source and "make_loaders" not in source
