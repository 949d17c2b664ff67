"""Benchmarks: `python -m bench.<name> [--quick] [--json PATH]`; docs/RESULTS.md has the numbers."""
