"""Shared shapes, dtypes and tolerances for the kernel tests (CPU interpreter or GPU)."""

import itertools
import os

import numpy as np
import pytest
import torch

from .conftest import DEVICE, HAS_CUDA

# The interpreter computes bf16 dots wrongly, so CPU runs fp32/fp16; the GPU runs bf16/fp16.
DTYPES = [torch.bfloat16, torch.float16] if HAS_CUDA else [torch.float32, torch.float16]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
HEAD_DIMS = [64, 128]
# (query heads, kv heads): GQA ratios 1, 4 and 7
HEADS = [(2, 2), (8, 2), (7, 1)]


def with_dtypes(*axes):
    """(dtype, *case) for every case in the product of `axes` (an axis of tuples spreads them into the case).

    On a GPU, every case in each dtype. Under the interpreter, whose cost is per program, each case in one dtype:
    DTYPES[sum of its axis indices % 2]. Changing any one axis flips the dtype, so each dtype still meets every
    value of every axis, and every combination of all the axes but one. The dtype sets only the dot's precision
    and the element type; the paths through the indexing (GQA groups, pages, tiles, splits) are one code in both.
    """
    cases = []
    for index in itertools.product(*(range(len(axis)) for axis in axes)):
        values = [axis[i] for axis, i in zip(axes, index)]
        case = tuple(x for v in values for x in (v if isinstance(v, tuple) else (v,)))
        dtypes = DTYPES if HAS_CUDA else [DTYPES[sum(index) % len(DTYPES)]]
        cases += [pytest.param(dtype, *case, id="-".join(map(str, (str(dtype)[6:], *case)))) for dtype in dtypes]
    return cases


def assert_close(out, ref, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=DEVICE, dtype=dtype)


def paged_cache(num_blocks, page, hkv, d, dtype, gen):
    return randn(num_blocks, page, hkv, d, dtype=dtype, gen=gen), randn(num_blocks, page, hkv, d, dtype=dtype, gen=gen)


def block_tables_for(ctx_lens, page, num_blocks, gen):
    """Scattered (non-contiguous) pages for each sequence, padded with zeros."""
    need = [-(-n // page) for n in ctx_lens]
    perm = torch.randperm(num_blocks, generator=gen)[: sum(need)]
    width = max(need)
    bt = torch.zeros(len(ctx_lens), width, dtype=torch.int32)
    start = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[start : start + n]
        start += n
    return bt.to(DEVICE)


@pytest.fixture
def e4m3_rounding_as_on_the_gpu(monkeypatch):
    """Triton's interpreter rounds fp32 to e4m3 wrongly (ties go up, and a carry out of the mantissa is lost:
    124 becomes 64). Under it, the cast rounds to nearest even as the GPU and torch do, so kernels that write
    e4m3 can be compared with their references bit for bit (use with pytest.mark.usefixtures)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def rounded(x, src, dst, rounding_mode):
        if dst != tl.float8e4nv or src not in (tl.float32, tl.float16):
            return convert(x, src, dst, rounding_mode)
        e4m3 = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.float8_e4m3fn)
        return e4m3.view(torch.uint8).numpy()

    monkeypatch.setattr(interpreter, "_convert_float", rounded)
