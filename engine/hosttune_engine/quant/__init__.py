"""Quantized weights: the public checkpoint layouts (FP8 block-wise, compressed-tensors FP8, AWQ, GPTQ),
their parsing and checks, the quantized linear layers and the transform that puts them into a built model."""
