#!/usr/bin/env python3
"""Can a Triton GEMM beat cuBLAS on the decode step's projections at 64 and 128 rows (H200, bf16)?

The kernel computes y = x @ w^T as (w @ x^T)^T ("swap AB"): the weight tile is the wide MMA operand and the
few rows of x the narrow one, both loaded through tensor descriptors (TMA), with optional split-K (fp32
atomics) for the narrow projections. Per projection of the Qwen2.5-7B shape it sweeps launch configs against
`F.linear` (do_bench, L2 flushed), then replays a whole step (all 28 layers' projections on distinct weights
plus the LM head) as one CUDA graph with the best config per shape, against the same graph through cuBLAS.
Prints a table last; writes JSON. Example: python benchmarks/engine/skinny_gemm.py --out /tmp/skinny.json

Result on 2026-11-29 (benchmarks/history/NOTES.md, "Engine performance on H200"): no; 0.96x cuBLAS at 64 rows, 0.82x at 128.
At 256 rows, where the projections are compute-bound, see wide_gemm.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.gemm_sweep import cublas_step_ms, step_ms, sweep


@triton.jit
def _swap_ab_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    wd = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    k_lo = pid_k * (K // SPLIT_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in tl.range(k_lo, k_lo + K // SPLIT_K, BLOCK_K):
        acc = tl.dot(wd.load([pid_n * BLOCK_N, k0]), xd.load([0, k0]).T, acc)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
    if SPLIT_K == 1:
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")


def swap_ab_linear(x: torch.Tensor, w: torch.Tensor, cfg: tuple, workspace: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T with cfg = (BLOCK_N, BLOCK_M, BLOCK_K, warps, stages, split_k)."""
    (m, k), n = x.shape, w.shape[0]
    bn, bm, bk, warps, stages, split = cfg
    y = torch.empty(m, n, device=x.device, dtype=x.dtype) if split == 1 else workspace[:m * n].view(m, n).zero_()
    _swap_ab_kernel[(triton.cdiv(n, bn), split)](x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                                                 BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split,
                                                 num_warps=warps, num_stages=stages)
    return y if split == 1 else y.to(x.dtype)


def candidates(n: int, k: int, block_m: int) -> list[tuple]:
    tiles = ((128, 4), (128, 6), (256, 3), (64, 8)) if block_m == 64 else ((128, 4), (64, 6))  # (BLOCK_K, stages)
    out = []
    for bn in (64, 128):
        for bk, stages in tiles:
            for split in (1, 2, 4):
                fits = (bn + block_m) * bk * 2 * stages <= 220 * 1024 and k % (bk * split) == 0
                if fits and (split == 1 or n <= 8192):
                    out.append((bn, block_m, bk, 4, stages, split))
    return out


def whole_step(rows: int, best: dict[str, tuple], workspace: torch.Tensor) -> dict:
    cublas = cublas_step_ms(rows)
    ours = step_ms(rows, lambda name: lambda x, w: swap_ab_linear(x, w, best[name], workspace))
    return {"rows": rows, "cublas_ms": cublas, "triton_ms": ours, "ratio_vs_cublas": cublas / ours}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="skinny_gemm.json")
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128], help="decode batch sizes (<= 128)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("skinny_gemm.py needs a CUDA GPU (Hopper: tensor descriptors)")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    workspace = torch.empty(8 << 20, device="cuda", dtype=torch.float32)  # split-K partial sums
    result = {"sweep": [], "whole_step": []}
    log = lambda row: (result["sweep"].append(row), print(json.dumps(row, default=str), flush=True))  # noqa: E731
    for rows in args.rows:
        best = sweep(rows, swap_ab_linear, lambda n, k: candidates(n, k, 64 if rows <= 64 else 128), workspace, log)
        result["whole_step"].append(whole_step(rows, best, workspace))
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print("\n| rows | cuBLAS step | Triton swap-AB step | ratio |\n| --- | --- | --- | --- |")
    for r in result["whole_step"]:
        print(f"| {r['rows']} | {r['cublas_ms']:.2f} ms | {r['triton_ms']:.2f} ms | {r['ratio_vs_cublas']:.2f} |")


if __name__ == "__main__":
    main()
