"""Typed records of the data that crosses the profiler's boundaries: the summary JSON (summary.py),
the run's metrics JSON (metrics.py), parsed once (parse.py). docs/summary.schema.json is made from
them: `python -m handler.profiling.record --schema > docs/summary.schema.json`."""
