"""Reading Nsight Systems reports of training runs: `python -m handler.profiling.report`.

nsys exports the report to SQLite (trace.py reads it), analysis.py turns the NVTX
ranges of docs/PROFILING.md into per-rank numbers, with the GPU-side view (gpu_view.py),
communication and stragglers (comm.py) and GPU metrics (gpu_metrics.py); render.py
writes them for people.
"""
