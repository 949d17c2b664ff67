"""The DDP modes' communication options (docs/COMM.md): one section, checked before any
process starts, and handed as it is to CommHook (handler/DDP/comm_hook.py)."""
from dataclasses import dataclass

from ..runtime.errors import need
from ..train.options import Options, above, at_least, changed, option

COMM_HOOKS = ("allreduce", "fp16", "bf16", "powersgd")  # DDP's gradient exchange; handler/DDP/comm_hook.py
WARMUP_FIX = ("torch's PowerSGD starts after DDP rebuilds its buckets (after the first step) and needs 2 or more "
              "plain steps; use --powersgd-warmup 2 or more")


@dataclass(frozen=True, kw_only=True)
class CommOptions(Options):
    """How DDP exchanges gradients: the hook that runs on each bucket, and the buckets themselves."""
    TITLE = "ddp/ddp_dali communication (docs/COMM.md)"
    REFUSAL = "{flags} tune{s} DDP's gradient all-reduce; use --mode {owners}, or drop {it} for --mode {mode}"
    comm_hook: str = option("allreduce", choices=COMM_HOOKS,
                            help="ddp/ddp_dali gradient exchange: plain all-reduce, fp16 or bf16 compression, or "
                                 "PowerSGD low-rank compression (docs/COMM.md)")
    powersgd_rank: int = option(2, metavar="R", within=at_least(1, "use 1 or more (2 is the default)"), help="PowerSGD: rank of each gradient's approximation "
                                                     "(higher: more bytes, closer to exact)")
    powersgd_warmup: int = option(10, metavar="N", within=at_least(2, WARMUP_FIX), help="PowerSGD: steps of plain all-reduce before compression "
                                                        "starts (at least 2)")
    bucket_cap_mb: float = option(25.0, metavar="MB", within=above(0, "use a positive size in MB (DDP's default 25)"),
                                  help="DDP gradient bucket size: smaller buckets start "
                                                           "communicating earlier in backward")
    static_graph: bool = option(False, help="DDP static_graph: the same parameters get gradients every step")
    grad_as_bucket_view: bool = option(False, help="DDP gradient_as_bucket_view: gradients live in the buckets "
                                                   "(one copy less)")


def check_comm(cfg) -> None:
    comm = CommOptions.of(cfg)
    powersgd_only = [f for f in changed(comm) if f.startswith("--powersgd")]
    need(not powersgd_only or comm.comm_hook == "powersgd",
         f"{' '.join(powersgd_only)} configure{'s' if len(powersgd_only) == 1 else ''} PowerSGD; "
         f"add --comm-hook powersgd or drop {'it' if len(powersgd_only) == 1 else 'them'}")
