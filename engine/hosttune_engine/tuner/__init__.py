"""`hosttune-engine tune`: time each planned kernel's candidate launch configs on this GPU, within a time
budget, and write the winners to the tuned-table cache the engine reads at start (kernels/tuning.py)."""
