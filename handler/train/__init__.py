"""The training every mode shares: the frozen run configuration (config), the checks before
any process starts (preflight), what a mode contributes (mode: its checks and entry;
strategy: how it wraps, loads and steps), the one training loop (loop) and the run around it
(trainer: fit, the outline; build: everything it needs, made once), checkpoints, divergence guards, the metrics file and model options. It may import
handler/data and handler/runtime; the modes import it, and it imports no mode."""
