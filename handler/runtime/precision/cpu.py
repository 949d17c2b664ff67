"""Whether bf16 runs natively on this CPU: without avx512_bf16/amx_bf16 oneDNN emulates
it, and bf16 autocast trains many times slower than fp32."""
import os
import time

import torch

NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) under which it uses no bf16 instructions.
EMULATING_CAPS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    if cap in EMULATING_CAPS:
        return False
    try:
        with open(cpuinfo) as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return any(flag in flags for flag in NATIVE_FLAGS)


def bf16_slowdown(repeats: int = 3) -> float:
    """bf16 ÷ fp32 time of one small convolution, best of `repeats`: about 0.1 s."""
    conv = torch.nn.Conv2d(32, 32, 3, padding=1)
    x = torch.randn(16, 32, 32, 32)

    def best(dtype) -> float:
        times = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            conv(x)  # warm-up: oneDNN picks and builds its kernel
            for _ in range(repeats):
                t = time.perf_counter()
                conv(x)
                times.append(time.perf_counter() - t)
        return min(times)
    return best(torch.bfloat16) / best(torch.float32)


def bf16_note() -> str:
    """One line for --amp bf16 on a CPU that emulates bf16, else ""."""
    if native_bf16():
        return ""
    return (f"bf16 on this CPU is emulated (no avx512_bf16/amx_bf16 in use): a convolution runs "
            f"{bf16_slowdown():.1f}x the fp32 time here; --amp off trains faster on this machine")
