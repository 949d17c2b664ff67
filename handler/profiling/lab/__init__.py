"""The lab page over a folder of reports (page.py), the cell each report belongs to (cells.py) and its
figures (figures.py), docs/PROFILING.md "The lab page"; the check of a summary JSON against its contract,
docs/summary.schema.json, before any reader uses it (summary_check.py), and of a run's metrics JSON the
report reads (metrics_file.py)."""
