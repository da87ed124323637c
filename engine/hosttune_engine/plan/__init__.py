"""The kernel plan's values: which kernel, with which launch config, runs each operation of a model at each
row count on one GPU, and why; the layers read them. `planner` builds a plan and prepares a model from it."""
