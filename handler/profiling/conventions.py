"""The NVTX naming conventions the report understands, as data: one table of patterns each.

A convention says which ranges are epochs, which are steps, and which phase each other range
is. The report reads any of them by renaming the ranges to ours (handler/runtime/names.py) as
it loads them, so the analysis has one vocabulary: ours is kept as it is; the course kit's
("Epoch 0" > "Batch i" > "upload data to GPU", "forward", "loss", "backward"; and the names
of loops shaped like it, as PyTorch's MNIST example profiled: "Data loading", "Copy to device",
"Forward pass", "Backward pass", torch.optim's own "Optimizer.step#Adadelta.step") and
torch.profiler's (`ProfilerStep#N`, no epochs: the steps of a process are one epoch) are
matched without regard to case; a user's mapping (`--ranges epoch='Epoch *' step='Batch *'
h2d='upload data to GPU'`) is a convention too. docs/PROFILING.md lists them.
"""
import fnmatch
import re
from dataclasses import dataclass

from handler.runtime.errors import UserError
from handler.runtime.names import BACKWARD, BATCH, DATA, EPOCH, FORWARD, H2D, OPTIMIZER, PHASES, RANK, TEST, VALIDATE


@dataclass(frozen=True)
class Convention:
    name: str  # what the summary says it used
    epoch: re.Pattern | None  # group 1 is the epoch's number (no group: numbered in order); None: steps only
    step: re.Pattern  # group 1 is the step's number
    phases: tuple[tuple[re.Pattern, str], ...] = ()  # (range name pattern, our phase), first match wins
    outside: tuple[tuple[re.Pattern, str], ...] = ()  # (pattern, ours) for the passes outside training

    def canonical(self, text: str) -> str | None:
        """Our name for a range of this convention; None for a range it does not name."""
        if self.epoch is not None and (found := self.epoch.fullmatch(text)):
            return EPOCH(int(found.group(1)) if self.epoch.groups else 0)
        if found := self.step.fullmatch(text):
            return BATCH(int(found.group(1)))
        return next((ours for pattern, ours in (*self.phases, *self.outside) if pattern.fullmatch(text)), None)


def _words(text: str) -> re.Pattern:
    return re.compile(re.escape(text), re.I)


OURS = Convention("ours", EPOCH.pattern, BATCH.pattern, tuple((re.compile(re.escape(p)), p) for p in PHASES))
KIT = Convention(
    "lab kit", re.compile(r"Epoch\s*(\d+)", re.I), re.compile(r"(?:Train\s+)?Batch\s*(\d+)", re.I),
    ((re.compile(r"upload data to GPU|copy to device", re.I), H2D),
     (re.compile(r"forward(?:\s+pass)?", re.I), FORWARD), (_words("loss"), FORWARD),
     (re.compile(r"backward(?:\s+pass)?", re.I), BACKWARD),
     (re.compile(r"optimi[sz]er(?:\s*step)?|Optimizer\.(?:step|zero_grad)#.*", re.I), OPTIMIZER),
     (re.compile(r"(?:load|fetch)\s+data|data\s+loading", re.I), DATA)),
    ((_words(TEST), TEST), (re.compile(r"validat(?:e|ion)", re.I), VALIDATE)))
TORCH_PROFILER = Convention("torch.profiler", None, re.compile(r"ProfilerStep#(\d+)"))
BUILT_IN = (OURS, KIT, TORCH_PROFILER)  # tried in this order; ours first, so our runs read as before


def detect(names) -> Convention | None:
    """The first built-in convention whose epochs (steps, for torch.profiler) appear among the
    range names, or ours when a `rank N` mark is there; None when none does."""
    names = set(names)
    if any(RANK.match(n) for n in names):
        return OURS
    for convention in BUILT_IN:
        pattern = convention.epoch or convention.step
        if any(pattern.fullmatch(n) for n in names):
            return convention
    return None


def unmatched_phases(convention: str, ranks: list[dict]) -> str | None:
    """The page's line where the ranks have steps but no range inside them bore a phase name of the
    convention (its loop names its phases otherwise): every phase would read 0 and a step all other."""
    if not any(r["batches"]["count"] for r in ranks) or any(
            phase["count"] for r in ranks for phase in r["phases"].values()):
        return None
    return (f"no range inside the steps bears a phase name of the {convention} convention (docs/PROFILING.md, "
            "\"Naming conventions\"), so every phase reads 0 and all of a step is other; name the phases with "
            "--ranges, e.g. --ranges step='Batch *' data='Data loading' h2d='Copy to device' forward='Forward pass' "
            "backward='Backward pass' optimizer='Optimizer.step*'")


MAPPING_KEYS = ("epoch", "step", *PHASES)


def from_mapping(items: list[str]) -> Convention:
    """A convention from `key=pattern` items: the step pattern holds one `*` for the number, the
    epoch pattern one or none (`epoch='Train'`: one range without a number a pass, numbered 0, 1, ...
    in order); phase patterns are shell-style (`*` any text). Matched without regard to case."""
    given = {}
    for item in items:
        key, sep, pattern = item.partition("=")
        if not sep or key not in MAPPING_KEYS or not pattern:
            raise UserError(f"--ranges item {item!r} is not KEY=PATTERN with KEY one of {', '.join(MAPPING_KEYS)}; "
                            "e.g. --ranges epoch='Epoch *' step='Batch *' h2d='upload data to GPU'")
        given[key] = pattern
    if "step" not in given:
        raise UserError("--ranges needs step=PATTERN (the name of one training step, `*` for its number), "
                        "e.g. step='Batch *'")
    return Convention("user mapping (" + " ".join(f"{k}={v!r}" for k, v in given.items()) + ")",
                      _numbered(given["epoch"], "epoch", unnumbered=True) if "epoch" in given else None,
                      _numbered(given["step"], "step"),
                      tuple((re.compile(fnmatch.translate(v), re.I), k) for k, v in given.items() if k in PHASES))


def _numbered(pattern: str, key: str, unnumbered: bool = False) -> re.Pattern:
    if unnumbered and "*" not in pattern:
        return re.compile(re.escape(pattern), re.I)
    if pattern.count("*") != 1:
        raise UserError(f"--ranges {key}={pattern!r} needs exactly one `*` where the number goes, "
                        f"e.g. {key}='{key.title()} *'" + (f" (or none: {key}='Train')" if unnumbered else ""))
    before, after = pattern.split("*")
    return re.compile(re.escape(before) + r"(\d+)" + re.escape(after), re.I)


# Libraries that open NVTX ranges of their own, before the loop's first epoch too: (library,
# name prefixes), for reports whose ranges carry no named NVTX domain. A range in a named
# domain is that domain's (DALI names its domain "DALI"; NCCL 2.x "NCCL"); docs/PROFILING.md, "Setup".
LIBRARY_PREFIXES = (
    ("DALI", ("[DALI]", "[Exec]", "TensorList", "~TensorList")),
    ("NCCL", ("nccl",)),
    ("PyTorch", ("aten::",)),
    ("MPI", ("MPI_",)),
    ("cuDNN", ("cudnn",)),
    ("cuBLAS", ("cublas",)),
)


KIT_SETUP = ("Set data loader", "Set Data Parallelism", "Sync model parameters")  # the kit's loop, before epoch 0


def library_of(name: str, domain: str | None) -> tuple[str, str] | None:
    """(library, "domain" or "prefix") for a library's own range; None for the loop's: the
    kit's setup ranges, whatever domain they are in, and any range no library claims."""
    if name.lower() in {s.lower() for s in KIT_SETUP}:
        return None
    if domain:
        return domain, "domain"
    return next(((library, "prefix") for library, prefixes in LIBRARY_PREFIXES
                 if name.lower().startswith(tuple(p.lower() for p in prefixes))), None)
