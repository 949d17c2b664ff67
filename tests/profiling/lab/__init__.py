"""Tests of the lab page and of profiles named by other conventions (the lab kit's, torch.profiler's, a user's)."""
