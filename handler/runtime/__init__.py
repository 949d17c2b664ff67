"""The process and the machine, below any training: which devices exist and which torch
build fits them (devices, cuda_build), the collectives and rank-0 output every rank shares
(dist, rank0), stop signals and one-line errors (stopping, errors), the CPU's precision and
allocator (precision/cpu.py, cpu_memory), the NVTX ranges and phase timers that profiling
reads (nvtx, phases), the user's umask, which nsys replaces (umask), and an output folder checked before any
work (out_folder). Anything may import
it; it imports nothing else from handler/."""
