#!/usr/bin/env python3
"""Does another cuBLAS path run the decode step's projections faster than the engine's `F.linear`?

The engine's projections are `F.linear(x, w)` with w [N, K] (a "TN" GEMM) through torch's default BLAS
handle. At 256 rows a decode step's projections are bound by FLOPs, and cuBLAS's heuristic picks one kernel
per shape; a different entry point can pick another. This times, per projection of the Qwen2.5-7B shape and
as a whole step replayed as one CUDA graph (28 layers on distinct weights plus the LM head):
  linear      F.linear(x, w), torch's default library (what the engine runs)
  linear-lt   the same with torch.backends.cuda.preferred_blas_library("cublaslt")
  mm-nn       x @ wt with wt [K, N] stored transposed (an "NN" GEMM)
  mm-nn-lt    the same through cuBLASLt
Every path's output is checked against `F.linear`. Prints a table last; writes JSON.
Example: python benchmarks/engine/blas_layouts.py --rows 64 256 --out /tmp/blas.json

Result on 2026-12-01 (benchmarks/history/NOTES.md): at 256 rows the paths' whole-step times overlap across
rounds; at 64 rows cuBLASLt with the transposed layout was 7% faster. The engine run on cuBLASLt was not
faster, so it keeps torch's default.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.common import bench_ms, blas_library, env_info
from benchmarks.engine.gemm_sweep import PROJECTIONS, step_ms

PATHS = {"linear": ("cublas", False), "linear-lt": ("cublaslt", False),  # name: (library, weight as [K, N])
         "mm-nn": ("cublas", True), "mm-nn-lt": ("cublaslt", True)}


def _linear(x: torch.Tensor, w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x @ w if transposed else F.linear(x, w)


def projection_rows(rows: int) -> list[dict]:
    out = []
    for name, (n, k) in PROJECTIONS.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wt = w.t().contiguous()
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w).float()
        row = {"rows": rows, "shape": name}
        for path, (library, transposed) in PATHS.items():
            weight = wt if transposed else w
            with blas_library(library):
                row[f"{path}_err"] = (_linear(x, weight, transposed).float() - ref).abs().max().item()
                row[f"{path}_us"] = bench_ms(lambda: _linear(x, weight, transposed)) * 1e3
        row["tflop_s_linear"] = 2 * rows * n * k / row["linear_us"] / 1e6
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def whole_step(rows: int, rounds: int) -> dict:
    """Each path's whole-step graph, timed in `rounds` interleaved rounds (the median of each path's rounds):
    one path measured after another would also measure the clocks drifting between them."""
    times = {path: [] for path in PATHS}
    for _ in range(rounds):
        for path, (library, transposed) in PATHS.items():
            with blas_library(library):
                times[path].append(step_ms(rows, lambda name, t=transposed: _step_linear(t)))
    res = {"rows": rows, "rounds": times, **{f"{p}_ms": statistics.median(t) for p, t in times.items()}}
    print(json.dumps(res), flush=True)
    return res


def _step_linear(transposed: bool):
    """(x, w) -> y for step_ms, whose weights are [N, K]: a transposed path reads the same bytes as [K, N]."""
    if not transposed:
        return F.linear
    return lambda x, w: x @ w.view(w.shape[1], w.shape[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the whole-step graphs")
    parser.add_argument("--out", default="blas-layouts.json")
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args()
    result = {"env": env_info(args.commit), "projections": [], "steps": []}
    for rows in args.rows:
        result["projections"] += projection_rows(rows)
        result["steps"].append(whole_step(rows, args.rounds))
        Path(args.out).write_text(json.dumps(result, indent=1))
    print("| rows | projection | " + " | ".join(f"{p} µs" for p in PATHS) + " | best / linear |")
    print("| --- | --- |" + " --- |" * (len(PATHS) + 1))
    for r in result["projections"]:
        best = min(r[f"{p}_us"] for p in PATHS)
        print(f"| {r['rows']} | {r['shape']} | " + " | ".join(f"{r[f'{p}_us']:.1f}" for p in PATHS)
              + f" | {r['linear_us'] / best:.2f}x |")
    for s in result["steps"]:
        best = min(s[f"{p}_ms"] for p in PATHS)
        print(f"| {s['rows']} | whole step (graph) | " + " | ".join(f"{s[f'{p}_ms']:.2f} ms" for p in PATHS)
              + f" | {s['linear_ms'] / best:.2f}x |")


if __name__ == "__main__":
    main()
