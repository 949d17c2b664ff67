"""Tests of the scripts and benches: launch.sh, the nsys install and watchdog, bench.*, the local Slurm cluster (marker `cluster`), and the repository layout."""
