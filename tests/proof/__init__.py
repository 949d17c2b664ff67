"""Tests of the GPU proof: gpu_check's plan, environment report, budget and rows, rehearsed on the CPU."""
