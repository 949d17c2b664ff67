"""Tests of the profile analysis (real and synthetic nsys exports, GPU-side views, communication, pp bubble) and of the comparison report."""
