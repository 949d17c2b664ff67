"""Native bf16 or not: on the CPU (cpu.py: the flags oneDNN uses) and on the GPU (gpu.py: compute capability)."""
