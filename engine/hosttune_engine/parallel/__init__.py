"""Tensor parallelism as a transform of a built model: which part each rank holds, the sharded layers, the collectives."""
