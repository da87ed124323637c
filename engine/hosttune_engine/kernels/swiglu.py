"""SwiGLU activation: silu(gate) * up, computed in fp32, for a fused [gate | up] input."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_tensor


@triton.jit
def silu_mul(g, u):
    """silu(g) * u in fp32: the one formula of this kernel and of every kernel that fuses a SwiGLU (the GEMV
    prologue, the FP8 input quantization, the FP8 GEMM's epilogue), each rounding the result where it must."""
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = silu_mul(g, u)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (gate then up) -> [T, I]."""
    check_tensor("x", x, 2)
    check(x.shape[1] % 2 == 0, "x's last dim must be even (gate | up), got {}", x.shape[1])
    check_last_dim_contiguous("x", x)
    n = x.shape[1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        block = min(1024, triton.next_power_of_2(n))
        _swiglu_kernel[(x.shape[0], triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), n, BLOCK=block)
    return out


def swiglu_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
