"""Checks run once, before any worker starts, so bad input fails fast and in one line."""
import datetime
import json
import os
import socket
import tempfile

from .checkpoint import load_checkpoint
from ..data.dataset import load_splits, prepare_dataset
from ..runtime.errors import UserError
from ..runtime.machine import check_machine


def _writable_dir(path: str, flag: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise UserError(f"{flag} {path} is not writable ({err.strerror}); choose a writable "
                        f"directory with {flag}") from None


def _metrics_target(path: str) -> None:
    """--metrics is rewritten every epoch: it may replace only a metrics file of ours (an
    earlier run's, a resumed one's), never a checkpoint or any other file."""
    if not os.path.lexists(path):
        return
    try:
        with open(path) as f:
            data = json.load(f)
        ours = isinstance(data, dict) and {"schema", "config", "epochs"} <= data.keys()
    except (OSError, UnicodeDecodeError, ValueError):
        ours = False
    if not ours:
        raise UserError(f"--metrics {path} already exists and is not a metrics file of this harness "
                        "(it would be overwritten); choose another --metrics path")


def _check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as err:
            raise UserError(f"--port {port} on {host} is not available ({err.strerror}); choose "
                            "another port, or omit --port to pick a free one") from None


def _earlier_run(cfg, restarted: bool) -> None:
    """A fresh start would replace an earlier run's last.pt after its first epoch: refuse,
    unless the user resumes it or says --overwrite (an elastic restart resumes itself)."""
    last = os.path.join(cfg.ckpt, "last.pt")
    if cfg.save == "none" or cfg.resume is not None or cfg.overwrite or restarted or not os.path.isfile(last):
        return
    try:
        ckpt = load_checkpoint(last, "cpu")
        saved = ckpt.get("config", {})
        what = (f"a {saved.get('mode', '?')} {saved.get('model', '?')} run at epoch "
                f"{ckpt['epoch']}/{saved.get('epochs', '?')}")
    except UserError:
        what = "a file this harness cannot read"
    when = datetime.datetime.fromtimestamp(os.path.getmtime(last)).strftime("%Y-%m-%d %H:%M")
    raise UserError(f"{last} already holds {what} (saved {when}); continue it with --resume, "
                    "choose another --ckpt, or pass --overwrite to replace it")


def preflight(cfg, mode, *, spawning: bool, restarted: bool = False):
    """Validate the environment, with the mode's own checks (mode.preflight); when this
    process will spawn the ranks, also fetch the data (rank 0's job) and check the
    rendezvous port if one was given. Returns the resolved config."""
    if cfg.save != "none":
        _writable_dir(cfg.ckpt, "--ckpt")
        _earlier_run(cfg, restarted)
    _writable_dir(os.path.dirname(os.path.abspath(cfg.metrics)), "--metrics")
    _metrics_target(cfg.metrics)
    mode.preflight(cfg)
    check_machine(cfg, mode.one_process)
    ckpt = None
    if cfg.resume is not None:
        from .build import check_compatible, resume_path
        ckpt = load_checkpoint(resume_path(cfg), "cpu")
    if not spawning:
        return cfg
    if not mode.one_process and cfg.port:
        _check_port(cfg.host, cfg.port)  # early; the spawning process binds it later (DDP/utils.py held_store)
    cfg = prepare_dataset(cfg)
    splits = load_splits(cfg)  # reads every batch file: corrupt data fails here, named, before spawning
    if ckpt is not None:
        check_compatible(ckpt, cfg, len(splits.classes), resume_path(cfg))
    return cfg
