"""--mode ddp_dali's own option: which input its DALI pipelines read (docs/DALI.md)."""
from dataclasses import dataclass

from ..train.options import Options, option

ARRAY_SOURCES = ("memory", "raw", "jpeg")  # from the split arrays, whichever layout they were read from
SOURCES = (*ARRAY_SOURCES, "files")  # handler/DALI/cifar10_loader.py reads each; files: the PNG tree itself


@dataclass(frozen=True, kw_only=True)
class DaliOptions(Options):
    """What the pipelines read. The arrays in memory need no files; raw and jpeg are derived
    once (handler/DALI/derived.py), so the file readers and nvJPEG can be measured against them."""
    TITLE = "ddp_dali input (docs/DALI.md)"
    REFUSAL = "{flags} pick{s} ddp_dali's input files; use {it} with --mode {owners}, or drop {it} for --mode {mode}"
    # memory is the default: the fastest measured on CPU (docs/DALI.md). The metrics record the source that ran.
    dali_source: str = option("memory", choices=SOURCES,
                              help="ddp_dali input: the arrays in memory (default, fastest measured), one raw "
                                   "uint8 file per image, JPEG files decoded by DALI (on the GPU with "
                                   "device=mixed), or files: the PNG tree --data points at, as it is")
