"""Whether the GPUs in use run bf16 natively. torch.cuda.is_bf16_supported() counts
emulation since torch 2.4 (including_emulation=True), so it says True on Volta (V100) and
Turing (T4) too, where bf16 autocast is emulated and slow. Native bf16 starts at compute
capability 8.0 (Ampere): gpu_check's bf16 row, bench.gpu's precision and the refusal of
--amp bf16 all ask here, never torch's default."""
from typing import Optional, Tuple

NATIVE_BF16 = (8, 0)


def first_without_native_bf16(count: Optional[int] = None) -> Optional[Tuple[int, str, Tuple[int, int]]]:
    """(index, name, compute capability) of the first of the first `count` GPUs (all visible
    ones by default) without native bf16, or None when every one has it."""
    import torch
    for index in range(torch.cuda.device_count() if count is None else count):
        capability = tuple(torch.cuda.get_device_capability(index))
        if capability < NATIVE_BF16:
            return index, torch.cuda.get_device_name(index), (capability[0], capability[1])
    return None


def native_bf16(count: Optional[int] = None) -> bool:
    """True when there are GPUs and every one of them (of the first `count`) runs bf16 natively."""
    import torch
    return torch.cuda.device_count() > 0 and first_without_native_bf16(count) is None


def bf16_refusal(count: int) -> str:
    """The one line refusing --amp bf16 on these GPUs, or "" where it runs natively."""
    found = first_without_native_bf16(count)
    if found is None:
        return ""
    index, name, (major, minor) = found
    return (f"--amp bf16: GPU {index} ({name}, compute capability {major}.{minor}) has no native bf16 "
            f"(it needs {NATIVE_BF16[0]}.{NATIVE_BF16[1]}, Ampere or newer) and would emulate it slowly; "
            "use --amp fp16")
