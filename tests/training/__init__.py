"""Tests of training itself: every mode, the toolbox flags, equal gradients, resume, faults, safety guards, pp, comm hooks, data and DALI loaders, command-line errors."""
