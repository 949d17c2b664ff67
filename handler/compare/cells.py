"""What a comparison runs: variants (a mode plus its options) crossed with process counts.

A variant is written `MODE`, `MODE:ARGS` or `LABEL=MODE:ARGS`, e.g. `ddp:--amp bf16`
or `fast=ddp:--amp bf16 --channels-last`; ARGS go to train_cifar.py for that variant only.
"""
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ..runtime.errors import UserError, shown

# The runner sets these per cell; a user's copy would silently break the matrix.
RESERVED = ("--mode", "--num_gpu", "--num-gpu", "--metrics")
DEFAULT_COUNTS = (1, 2, 4)
CPU_COUNTS = (1, 2)
HOOKED_MODES = ("ddp", "ddp_dali")  # the modes with --comm-hook (docs/COMM.md)
DP_CPU_SKIP = "dp needs GPUs to split work; on CPU it is one process whatever the count"


@dataclass(frozen=True)
class Variant:
    label: str
    mode: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cell:
    variant: Variant
    count: int

    @property
    def name(self) -> str:
        return f"{self.variant.label} x{self.count}"

    @property
    def slug(self) -> str:
        """The cell's folder and file stem: the name with only filename-safe characters."""
        return re.sub(r"[^A-Za-z0-9.+]+", "-", f"{self.variant.label} n{self.count}").strip("-")


def parse_variant(spec: str, modes: Sequence[str], flag: str = "--cell") -> Variant:
    """flag: the option that named the variant, as the user typed it (--modes names a mode alone)."""
    if flag == "--modes":
        if spec not in modes:
            raise UserError(f"--modes: {spec!r} is not a mode; name modes among {', '.join(modes)} (options of a "
                            "mode go in --cell 'MODE:ARGS')")
        return Variant(spec, spec)
    head, _, rest = spec.partition(":")
    label, _, mode = head.rpartition("=")
    mode, label = mode.strip(), label.strip()
    if mode not in modes:
        raise UserError(f"--cell {spec!r}: {mode!r} is not a mode; write MODE, MODE:ARGS or "
                        f"LABEL=MODE:ARGS with MODE one of {', '.join(modes)}")
    args = tuple(split_args(rest, f"--cell {spec!r}"))
    check_args(args, f"--cell {spec!r}")
    return Variant(shown(label or " ".join((mode, *args))), mode, args)  # a byte not UTF-8: \xNN on pages, plots


def split_args(text: str, where: str) -> list[str]:
    """A user's string of train_cifar.py options, split as a shell would; an unclosed quote or a
    trailing backslash is one line naming `where`."""
    try:
        return shlex.split(text)
    except ValueError as err:
        raise UserError(f"{where} cannot be split into options ({err}: a quote is not closed, or a backslash "
                        "ends it); close the quote, e.g. --extra \"--label 'my run'\"") from None


def check_args(args: Sequence[str], where: str) -> None:
    for arg in args:
        if arg.split("=")[0] in RESERVED:
            raise UserError(f"{where} sets {arg.split('=')[0]}, which the runner sets for every cell; "
                            "use --modes/--cell for modes and --counts for process counts")


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise UserError(f"--counts {text!r} is not a list of positive integers; write e.g. --counts 1,2,4")
    return tuple(sorted(set(counts)))


def default_counts(gpus: int) -> tuple[int, ...]:
    """{1, 2, 4} capped at the visible GPUs; {1, 2} CPU processes without GPUs."""
    if not gpus:
        return CPU_COUNTS
    return tuple(sorted({min(c, gpus) for c in DEFAULT_COUNTS}))


def build_variants(modes_text: str | None, cell_specs: Sequence[str], all_modes: Sequence[str]) -> list[Variant]:
    """--modes adds plain variants, each --cell one more; with neither, every mode runs plain."""
    variants: list[Variant] = []
    if modes_text is not None:
        for mode in (m.strip() for m in modes_text.split(",") if m.strip()):
            variants.append(parse_variant(mode, all_modes, "--modes"))
    variants += [parse_variant(spec, all_modes) for spec in cell_specs]
    if modes_text is None and not cell_specs:
        variants = [Variant(mode, mode) for mode in all_modes]
    labels = [v.label for v in variants]
    for label in labels:
        if labels.count(label) > 1:
            raise UserError(f"two variants are both labelled {label!r}; drop the duplicate or "
                            "name one with --cell 'LABEL=MODE:ARGS'")
    if not variants:
        raise UserError("nothing to run: --modes is empty; name at least one mode or --cell")
    return variants


def sweep_hooks(variants: list[Variant], hooks_text: str, hooks: Sequence[str]) -> list[Variant]:
    """--hooks: each ddp/ddp_dali variant once per --comm-hook, labelled `LABEL [hook]`; the
    other modes have no hook and run once."""
    chosen = [h.strip() for h in hooks_text.split(",") if h.strip()]
    for hook in chosen:
        if hook not in hooks:
            raise UserError(f"--hooks {hooks_text!r}: {hook!r} is not a hook; choose from {', '.join(hooks)}")
    if not chosen:
        raise UserError("--hooks is empty; name at least one of " + ", ".join(hooks))
    swept: list[Variant] = []
    for v in variants:
        if v.mode not in HOOKED_MODES:
            swept.append(v)
            continue
        if any(a.split("=")[0] == "--comm-hook" for a in v.args):
            raise UserError(f"variant {v.label!r} sets --comm-hook and --hooks sweeps it; drop one of them")
        swept += [Variant(f"{v.label} [{hook}]", v.mode, (*v.args, "--comm-hook", hook)) for hook in chosen]
    return swept


def matrix(variants: list[Variant], counts: Sequence[int]) -> list[Cell]:
    cells = [Cell(v, n) for v in variants for n in counts]
    slugs = [c.slug for c in cells]
    for cell in cells:
        if slugs.count(cell.slug) > 1:  # e.g. "--amp bf16" and "--amp=bf16"
            raise UserError(f"two variants would share the folder {cell.slug!r}; name them apart "
                            "with --cell 'LABEL=MODE:ARGS'")
    return cells


def skip_reason(cell: Cell, gpus: int) -> str:
    """Why a cell would only repeat another one, or "" when it is worth running."""
    if cell.variant.mode == "dp" and not gpus and cell.count > 1:
        return DP_CPU_SKIP
    return ""
