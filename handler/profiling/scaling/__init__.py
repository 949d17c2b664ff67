"""The what-if's model of a training step (handler/profiling/whatif.py, docs/PROFILING.md "What-if"):
the measured epoch every page uses (epochs.py), one split of a step by resource (step.py), the machine
a report ran on (machine.py), the run's own facts as written (run_facts.py) and as read (facts.py), the link (links.py), each mode's
scaling (scale.py) and the all-reduce model bench.comm fits (comm_model.py)."""
