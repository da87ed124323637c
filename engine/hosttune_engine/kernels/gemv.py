"""Matrix-vector product for one-token decode: y [M, N] = x [M, K] @ w[N, K].T (+ bias), M <= 4,
optionally with the layer before it computed in the prologue.

At batch 1 a decode step is a stream of weight reads; each program owns BLOCK_N
rows of w and walks K in BLOCK_K tiles, accumulating in fp32 with no tensor
cores (the operand is a vector). The output is written in `out_dtype`, so the
LM head can produce fp32 logits from bf16 weights.

Prologues (one row only): `gemv_rmsnorm` takes the raw hidden state (and the
residual) and applies RMSNorm on the fly, program 0 writing the new residual;
`gemv_swiglu` takes the fused [gate | up] projection and applies SwiGLU on the
fly. Intermediates are rounded to the weights' dtype exactly where the unfused
kernels round them, so a fused step computes what the unfused one does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.rmsnorm import rms_norm_ref
from hosttune_engine.kernels.swiglu import silu_mul, swiglu_ref

PLAIN, RMSNORM, RMSNORM_RESIDUAL, SWIGLU = 0, 1, 2, 3


@triton.jit
def _load_k(ptr, offs_k, k_mask, EVEN_K: tl.constexpr):
    """One K tile of a vector, in fp32 (unmasked when K is a multiple of the tile: vectorized loads)."""
    if EVEN_K:
        return tl.load(ptr + offs_k).to(tl.float32)
    else:
        return tl.load(ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)


@triton.jit
def _hidden_tile(x_ptr, r_ptr, offs_k, k_mask, PROLOGUE: tl.constexpr, EVEN_K: tl.constexpr):
    """x (+ residual, rounded to the storage dtype as the unfused add is) for one K tile, in fp32."""
    s = _load_k(x_ptr, offs_k, k_mask, EVEN_K)
    if PROLOGUE == 2:
        s = (s + _load_k(r_ptr, offs_k, k_mask, EVEN_K)).to(x_ptr.dtype.element_ty).to(tl.float32)
    return s


@triton.jit
def _weight_tile(w_rows, offs_k, n_mask, k_mask, EVEN_K: tl.constexpr):
    """Rows [BLOCK_N] of w at one K tile, as stored (unmasked along K when K is a multiple of the tile)."""
    if EVEN_K:
        return tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0)
    else:
        return tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)


@triton.jit
def _rms_rstd(x_ptr, r_ptr, res_out_ptr, K, eps, pid, PROLOGUE: tl.constexpr, EVEN_K: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """1 / RMS of the prologue's row (1.0 without an RMSNorm prologue); program 0 writes the new residual."""
    rstd = 1.0
    if PROLOGUE == 1 or PROLOGUE == 2:
        sq = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            s = _hidden_tile(x_ptr, r_ptr, offs_k, k_mask, PROLOGUE, EVEN_K)
            sq += s * s
            if PROLOGUE == 2:
                if pid == 0:
                    tl.store(res_out_ptr + offs_k, s.to(res_out_ptr.dtype.element_ty), mask=k_mask)
        rstd = 1.0 / tl.sqrt(tl.sum(sq, 0) / K + eps)
    return rstd


@triton.jit
def _input_tile(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, offs_k, k_mask, rstd, PROLOGUE: tl.constexpr,
                EVEN_K: tl.constexpr):
    """The GEMV's input for one K tile in fp32, after the prologue, rounded to x's dtype where the unfused
    kernels round (x and the weights share a dtype in the bf16 GEMV)."""
    if PROLOGUE == 0:
        return _load_k(x_ptr + m * stride_xm, offs_k, k_mask, EVEN_K)
    elif PROLOGUE == 3:
        g = _load_k(x_ptr, offs_k, k_mask, EVEN_K)
        u = _load_k(x_ptr + K, offs_k, k_mask, EVEN_K)
        return silu_mul(g, u).to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        s = _hidden_tile(x_ptr, r_ptr, offs_k, k_mask, PROLOGUE, EVEN_K)
        return (s * rstd * _load_k(nw_ptr, offs_k, k_mask, EVEN_K)).to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _rows_input(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, offs_k, k_mask, rstd, zero_rows, PROLOGUE: tl.constexpr,
                EVEN_K: tl.constexpr, XB: tl.constexpr):
    """The input tile as the weight tile's rows see it, [BLOCK_N, BLOCK_K] or [1, BLOCK_K], in fp32. With XB and
    no prologue each thread loads the columns of its own weights (zero_rows [BLOCK_N, 1] of zeros gives the load
    the weight tile's shape and layout; the repeats hit the cache), which spares the layout change through shared
    memory, and its barriers, that broadcasting one loaded vector costs every tile."""
    if XB and PROLOGUE == 0:
        ptrs = x_ptr + m * stride_xm + zero_rows + offs_k[None, :]
        if EVEN_K:
            return tl.load(ptrs).to(tl.float32)
        else:
            return tl.load(ptrs, mask=k_mask[None, :], other=0.0).to(tl.float32)
    else:
        return _input_tile(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, offs_k, k_mask, rstd, PROLOGUE, EVEN_K)[None, :]


@triton.jit
def _half2(lo, hi):
    """fp32 pairs -> fp16x2 words (lo in the low half), rounded to nearest: the packed quantized GEMVs' inputs
    (CUDA only, inline PTX)."""
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, res_out_ptr, N, K, stride_xm, stride_wn, stride_ym, eps,
                 M: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    rstd = _rms_rstd(x_ptr, r_ptr, res_out_ptr, K, eps, pid, PROLOGUE, EVEN_K, BLOCK_K)
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            w = _weight_tile(w_rows, offs_k, n_mask, k_mask, EVEN_K)
            x = _input_tile(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, offs_k, k_mask, rstd, PROLOGUE, EVEN_K)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, 1)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


DEFAULT = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4, "num_stages": 4}


def _check_weights(x, w, bias, k: int) -> None:
    check_tensor("w", w, 2, dtypes=(x.dtype,), device=x.device)
    check(w.shape[1] == k and w.stride(1) == 1, "w must be [N, {}] and contiguous in K, got {}", k, tuple(w.shape))
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == w.shape[0] and bias.is_contiguous(), "bias must be [{}] and contiguous", w.shape[0])


def _launch(x, w, bias, y, k, prologue, config, r=None, nw=None, res_out=None, eps=0.0):
    cfg = config or DEFAULT
    n = w.shape[0]
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, w, bias if bias is not None else w, y, r if r is not None else x, nw if nw is not None else x,
        res_out if res_out is not None else x, n, k, x.stride(0), w.stride(0), y.stride(0), eps,
        M=y.shape[0], HAS_BIAS=bias is not None, EVEN_K=k % cfg["BLOCK_K"] == 0, PROLOGUE=prologue,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
         config: dict | None = None) -> torch.Tensor:
    """x [M, K] (M <= 4), w [N, K], bias [N] -> [M, N] in out_dtype (default x's dtype)."""
    check_tensor("x", x, 2)
    m, k = x.shape
    check(1 <= m <= 4 and x.stride(1) == 1, "gemv takes 1 to 4 rows contiguous in K, got {}", tuple(x.shape))
    _check_weights(x, w, bias, k)
    y = torch.empty((m, w.shape[0]), dtype=out_dtype or x.dtype, device=x.device)
    return _launch(x, w, bias, y, k, PLAIN, config)


def gemv_rmsnorm(x, norm_weight, eps: float, w, bias=None, residual=None, residual_out=None, config=None):
    """RMSNorm(x (+ residual)) [1, K] @ w.T (+ bias) -> [1, N]; with a residual, x + residual goes to residual_out."""
    check_tensor("x", x, 2)
    k = x.shape[1]
    check(x.shape[0] == 1 and x.is_contiguous(), "gemv_rmsnorm takes one contiguous row, got {}", tuple(x.shape))
    check_tensor("norm_weight", norm_weight, 1, dtypes=(x.dtype,), device=x.device)
    check(norm_weight.shape[0] == k and norm_weight.is_contiguous(), "norm_weight must be [K] and contiguous")
    _check_weights(x, w, bias, k)
    if residual is not None:
        for name, t in (("residual", residual), ("residual_out", residual_out)):
            check(isinstance(t, torch.Tensor) and t.shape == x.shape and t.dtype == x.dtype and t.is_contiguous(),
                  "{} must be a contiguous tensor like x", name)
    y = torch.empty((1, w.shape[0]), dtype=x.dtype, device=x.device)
    prologue = RMSNORM if residual is None else RMSNORM_RESIDUAL
    return _launch(x, w, bias, y, k, prologue, config, r=residual, nw=norm_weight, res_out=residual_out, eps=eps)


def gemv_swiglu(gate_up, w, bias=None, config=None):
    """SwiGLU(gate_up [1, 2K]) @ w.T (+ bias) -> [1, N]."""
    check_tensor("gate_up", gate_up, 2)
    check(gate_up.shape[0] == 1 and gate_up.is_contiguous() and gate_up.shape[1] % 2 == 0,
          "gemv_swiglu takes one contiguous row of even width, got {}", tuple(gate_up.shape))
    k = gate_up.shape[1] // 2
    _check_weights(gate_up, w, bias, k)
    y = torch.empty((1, w.shape[0]), dtype=gate_up.dtype, device=gate_up.device)
    return _launch(gate_up, w, bias, y, k, SWIGLU, config)


def gemv_ref(x, w, bias=None, out_dtype=None):
    y = x.float() @ w.float().t() + (bias.float() if bias is not None else 0.0)
    return y.to(out_dtype or x.dtype)


def check_prologue(x, k: int, prologue: int, residual, norm_weight, residual_out) -> None:
    """The inputs a GEMV prologue reads (the quantized GEMVs take the prologue as an argument)."""
    check(prologue == PLAIN or x.shape[0] == 1, "a prologue takes one row, got {}", x.shape[0])
    if prologue in (RMSNORM, RMSNORM_RESIDUAL):
        check_tensor("norm_weight", norm_weight, 1, dtypes=(x.dtype,), device=x.device)
        check(norm_weight.shape[0] == k and norm_weight.is_contiguous(), "norm_weight must be [K] and contiguous")
    if prologue == RMSNORM_RESIDUAL:
        for name, t in (("residual", residual), ("residual_out", residual_out)):
            check(isinstance(t, torch.Tensor) and t.shape == x.shape and t.dtype == x.dtype and t.is_contiguous(),
                  "{} must be a contiguous tensor like x", name)


def prologue_ref(x, prologue: int, residual=None, norm_weight=None, residual_out=None, eps: float = 0.0):
    """The GEMV's input after its prologue, by the torch references (residual_out receives x + residual)."""
    if prologue == SWIGLU:
        return swiglu_ref(x)
    if prologue == RMSNORM:
        return rms_norm_ref(x, norm_weight, eps)
    if prologue == RMSNORM_RESIDUAL:
        x, new_residual = rms_norm_ref(x, norm_weight, eps, residual=residual)
        residual_out.copy_(new_residual)
    return x


def gemv_rmsnorm_ref(x, norm_weight, eps, w, bias=None, residual=None, residual_out=None):
    if residual is None:
        return gemv_ref(rms_norm_ref(x, norm_weight, eps), w, bias)
    normed, new_residual = rms_norm_ref(x, norm_weight, eps, residual=residual)
    residual_out.copy_(new_residual)
    return gemv_ref(normed, w, bias)


def gemv_swiglu_ref(gate_up, w, bias=None):
    return gemv_ref(swiglu_ref(gate_up), w, bias)
