"""Side-by-side runs of the parallel modes at several process counts: `python -m handler.compare`."""
