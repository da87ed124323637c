"""Which cuBLAS library torch's CUDA GEMMs go through: every projection of the model is a plain `F.linear`.

The two libraries pick their kernels by different heuristics. On the H200, with the decode step's
projections of the Qwen2.5-7B shape replayed as one CUDA graph, cuBLASLt ran the whole step faster than
torch's default cuBLAS at 64 and 256 rows (`benchmarks/engine/blas_layouts.py`, BENCHMARKS.md), so "auto"
picks it. The choice is torch's, per process: the engine sets it once, before it captures any graph.
"""

from __future__ import annotations

import torch

AUTO_LIBRARY = "cublaslt"


def select_blas_library(name: str) -> str:
    """Route this process's CUDA GEMMs through `name` ("auto" is `AUTO_LIBRARY`); returns the library set."""
    library = AUTO_LIBRARY if name == "auto" else name
    torch.backends.cuda.preferred_blas_library(library)
    return library
