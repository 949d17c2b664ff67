"""Tests of what the machine offers: GPU detection, CUDA builds, the CPU machine before and after install_nsys.sh, the CPU allocator, and the gpu-marked end-to-end tests with gpu_check."""
