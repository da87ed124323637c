"""The KV cache's memory: one tensor for all layers, sized from free device memory, with per-layer views."""
