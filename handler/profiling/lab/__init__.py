"""The lab page over a folder of reports (page.py), the cell each report belongs to (cells.py) and its
figures (figures.py), docs/PROFILING.md "The lab page"; the what-if over a folder (whatif_folder.py), and
the reading of a run's metrics JSON (metrics_file.py) into its record (handler/profiling/record/)."""
