"""handler/train/capture.py: which epochs a profile captures (docs/PROFILING.md, "Capture window")."""
import subprocess

import pytest

from handler.runtime.errors import UserError
from handler.train.capture import Capture, describe, parse_profile_epochs
from tests.nsys_helpers import REPO

OPTIONS = REPO / "scripts" / "nsys_options.sh"


@pytest.mark.parametrize("spec, epochs, window", [
    ("", 30, (1, 2)), ("", 4, (1, 2)), ("", 3, None), ("", 1, None), ("all", 30, None),
    ("0:0", 2, (0, 0)), ("3", 5, (3, 3)), ("2:29", 30, (2, 29))])
def test_the_window_and_its_default(spec, epochs, window):
    assert parse_profile_epochs(spec, epochs) == window


@pytest.mark.parametrize("spec, epochs, named", [
    ("1-2", 4, "is not A:B or all"), ("a:b", 4, "is not A:B or all"), ("1:2:3", 4, "is not A:B or all"),
    ("2:1", 4, "A <= B"), ("1:4", 4, "epochs 0..3"), ("-1:2", 4, "is not A:B or all")])
def test_a_bad_window_is_one_line_naming_the_fix(spec, epochs, named):
    with pytest.raises(UserError, match="--profile-epochs") as err:
        parse_profile_epochs(spec, epochs)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_the_window_keeps_to_the_epochs_a_resumed_run_trains():
    capture = Capture((1, 5))
    assert capture.fit_to(3, 10) is None and capture.window == (3, 5) and capture.epochs(3, 10) == [3, 4, 5]


def test_a_window_outside_the_run_captures_the_rest_and_says_so():
    capture = Capture((1, 2))
    note = capture.fit_to(4, 6)
    assert capture.window is None and capture.epochs(4, 6) == [4, 5]
    assert note and "--profile-epochs 1:2 lies outside epochs 4-5" in note


def test_the_launch_line_words():
    assert describe((1, 2), 4) == "epochs 1-2 of 4" and describe(None, 3) == "all 3 epochs"
    assert describe((2, 2), 4) == "epoch 2 of 4"


@pytest.mark.parametrize("spec, epochs", [("", 30), ("", 3), ("all", 5), ("1:2", 4), ("2", 4), ("0:3", 4)])
def test_launch_sh_names_the_window_the_trainer_captures(spec, epochs):
    """scripts/nsys_options.sh's capture_window (the launch line) follows the same rule."""
    out = subprocess.run(["bash", "-c", f'source "{OPTIONS}"; capture_window {epochs} "{spec}"'],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == describe(parse_profile_epochs(spec, epochs), epochs)


def test_closing_the_window_stops_this_process_s_nvtx_ranges(monkeypatch):
    """nsys goes on recording for a while after the capture range ends: no range may start then.
    torch.cuda.nvtx works on CPU (a no-op without a profiler), so nothing is mocked but the switch."""
    import torch

    from handler.runtime import nvtx
    monkeypatch.setattr(nvtx, "ACTIVE", True)
    monkeypatch.setattr(nvtx, "_nvtx", torch.cuda.nvtx, raising=False)
    capture = Capture((1, 1))
    capture.before_epoch(0)
    assert capture.handle is None
    capture.before_epoch(1)
    assert capture.handle is not None and nvtx.nvtx_range("epoch 1") is not nvtx.nvtx_range("epoch 2")
    capture.after_epoch(1)
    assert capture.handle is None and not nvtx.ACTIVE
    assert nvtx.nvtx_range("epoch 2") is nvtx.nvtx_range("epoch 3")  # the shared no-op


def test_without_the_capture_flags_the_whole_run_is_captured_and_its_ranges_go_on(monkeypatch):
    """An nsys started without scripts/nsys_options.sh's capture flags (handler.compare, bench)
    records everything: the window must not stop the ranges after epoch 2."""
    monkeypatch.delenv("HARNESS_CAPTURE_WINDOW", raising=False)
    assert Capture.start("", 30).window is None
    monkeypatch.setenv("HARNESS_CAPTURE_WINDOW", "1")
    assert Capture.start("", 30).window == (1, 2)
