"""The lab page over a folder of reports (page.py) and its figures (figures.py), docs/PROFILING.md "The lab page"."""
