#!/usr/bin/env python3
"""Can a Triton GEMM beat cuBLAS on the decode step's projections at 256 rows (H200, bf16)?

At 256 rows a decode step's projections are bound by FLOPs, not by weight bytes (benchmarks/history/NOTES.md, the
256 x (256 in / 512 out) workload): cuBLAS runs them at 447-699 TFLOP/s, and the narrow ones (qkv, o) fill
few of the 132 SMs. This sweeps a plain tensor-descriptor (TMA) GEMM, y = x @ w^T with x tiles [BM, BK] and
weight tiles [BN, BK], over tile shapes, warps, stages and split-K (fp32 atomics), per projection of the
Qwen2.5-7B shape, against `F.linear` (do_bench, L2 flushed). Programs run M tile fastest, so the M tiles of
one weight tile run side by side and read it from HBM once. It then replays a whole step (all 28 layers'
projections on distinct weights plus the LM head) as one CUDA graph with the best config per shape, against
the same graph through cuBLAS. Prints a table last; writes JSON.
Example: python benchmarks/engine/wide_gemm.py --out /tmp/wide.json --rows 256

Result on 2026-11-29 (benchmarks/history/NOTES.md, "Engine performance on H200"): no; the whole step 0.83x cuBLAS, every
projection slower except qkv, which cuBLAS runs slowly only outside the engine's graph (eager, without bias).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.common import SHAPE
from benchmarks.engine.gemm_sweep import cublas_step_ms, step_ms, sweep

SMEM_BYTES = 220 * 1024
MAX_ACC_REGS = 128  # fp32 accumulator registers a thread may hold before the kernel spills


@triton.jit
def _wide_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_m = tl.cdiv(M, BM)
    pid_m = pid % tiles_m
    pid_n = pid // tiles_m
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BM, BK])
    wd = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1], block_shape=[BN, BK])
    k_len = K // SPLIT_K
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in tl.range(pid_k * k_len, pid_k * k_len + k_len, BK):
        acc = tl.dot(xd.load([pid_m * BM, k0]), wd.load([pid_n * BN, k0]).T, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")


def wide_linear(x: torch.Tensor, w: torch.Tensor, cfg: tuple, workspace: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T with cfg = (BM, BN, BK, warps, stages, split_k)."""
    (m, k), n = x.shape, w.shape[0]
    bm, bn, bk, warps, stages, split = cfg
    y = torch.empty(m, n, device=x.device, dtype=x.dtype) if split == 1 else workspace[:m * n].view(m, n).zero_()
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), split)
    _wide_kernel[grid](x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                       BM=bm, BN=bn, BK=bk, SPLIT_K=split, num_warps=warps, num_stages=stages)
    return y if split == 1 else y.to(x.dtype)


def candidates(rows: int, n: int, k: int) -> list[tuple]:
    """Configs that fit shared memory and registers; split-K only while the grid stays under ~4 waves."""
    out = []
    for bm in (64, 128, 256):
        for bn in (64, 128, 256):
            for bk, stages in ((64, 3), (64, 4), (128, 3)):
                for warps in (4, 8):
                    for split in (1, 2, 3, 4):
                        tiles = triton.cdiv(rows, bm) * triton.cdiv(n, bn) * split
                        fits = ((bm + bn) * bk * 2 * stages <= SMEM_BYTES and bm * bn // (warps * 32) <= MAX_ACC_REGS
                                and k % (bk * split) == 0 and (split == 1 or tiles <= 4 * 132))
                        if fits and bm <= max(64, rows):
                            out.append((bm, bn, bk, warps, stages, split))
    return out


def whole_step(rows: int, best: dict[str, tuple], workspace: torch.Tensor) -> dict:
    def triton_for(names):
        return lambda name: ((lambda x, w: wide_linear(x, w, best[name], workspace)) if name in names else F.linear)
    cublas = cublas_step_ms(rows)
    ours = step_ms(rows, triton_for(set(best)))
    mixed = step_ms(rows, triton_for({"qkv", "o"}))
    flops = SHAPE.decode_step_flops(rows)
    return {"rows": rows, "cublas_ms": cublas, "triton_ms": ours, "qkv_o_triton_ms": mixed,
            "ratio_vs_cublas": cublas / ours, "cublas_tflop_s": flops / cublas / 1e9,
            "triton_tflop_s": flops / ours / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="wide_gemm.json")
    parser.add_argument("--rows", type=int, nargs="+", default=[256], help="decode batch sizes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("wide_gemm.py needs a CUDA GPU (Hopper: tensor descriptors)")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    workspace = torch.empty(max(args.rows) * SHAPE.vocab, device="cuda", dtype=torch.float32)  # split-K sums
    result = {"sweep": [], "whole_step": []}
    log = lambda row: (result["sweep"].append(row), print(json.dumps(row, default=str), flush=True))  # noqa: E731
    for rows in args.rows:
        best = sweep(rows, wide_linear, lambda n, k: candidates(rows, n, k), workspace, log, rep_ms=25)
        result["whole_step"].append(whole_step(rows, best, workspace))
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print("\n| rows | projection | cuBLAS | best Triton | ratio | config (BM, BN, BK, warps, stages, split) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in result["sweep"]:
        if "best" in r:
            print(f"| {r['rows']} | {r['shape']} | {r['cublas_us']:.1f} us ({r['cublas_tflop_s']:.0f} TFLOP/s) | "
                  f"{r['best_us']:.1f} us ({r['best_tflop_s']:.0f}) | {r['ratio_vs_cublas']:.2f} | {r['best']} |")
    print("\n| rows | cuBLAS step | Triton step | qkv+o Triton, rest cuBLAS | ratio |\n| --- | --- | --- | --- | --- |")
    for r in result["whole_step"]:
        print(f"| {r['rows']} | {r['cublas_ms']:.2f} ms ({r['cublas_tflop_s']:.0f} TFLOP/s) | {r['triton_ms']:.2f} ms "
              f"({r['triton_tflop_s']:.0f}) | {r['qkv_o_triton_ms']:.2f} ms | {r['ratio_vs_cublas']:.2f} |")


if __name__ == "__main__":
    main()
