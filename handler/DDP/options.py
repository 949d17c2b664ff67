"""The DDP modes' communication options (docs/COMM.md), checked before any process starts."""
from ..runtime.errors import need
from ..train.config import changed_comm_options


def check_comm(cfg) -> None:
    powersgd_only = [f for f in changed_comm_options(cfg) if f.startswith("--powersgd")]
    need(not powersgd_only or cfg.comm_hook == "powersgd",
         f"{' '.join(powersgd_only)} configure{'s' if len(powersgd_only) == 1 else ''} PowerSGD; "
         f"add --comm-hook powersgd or drop {'it' if len(powersgd_only) == 1 else 'them'}")
    need(cfg.powersgd_rank >= 1, f"--powersgd-rank {cfg.powersgd_rank}: use 1 or more (2 is the default)")
    need(cfg.powersgd_warmup >= 2,
         f"--powersgd-warmup {cfg.powersgd_warmup}: torch's PowerSGD starts after DDP rebuilds its buckets "
         "(after the first step) and needs 2 or more plain steps; use --powersgd-warmup 2 or more")
    need(cfg.bucket_cap_mb > 0, f"--bucket-cap-mb {cfg.bucket_cap_mb:g}: use a positive size in MB (DDP's default 25)")
