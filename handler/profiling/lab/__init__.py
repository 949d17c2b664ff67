"""The lab page over a folder of reports (page.py), the cell each report belongs to (cells.py) and its
figures (figures.py), docs/PROFILING.md "The lab page"; the check of a summary JSON a user hands to a
reader such as the what-if (summary_check.py), and of a run's metrics JSON the report reads (metrics_file.py)."""
