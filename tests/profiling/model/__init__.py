"""The what-if model: its properties on generated summaries, the runs users brought, the shared cores."""
