"""What skinny_gemm.py and wide_gemm.py share: the decode step's projections of the Qwen2.5-7B shape, a
per-projection sweep of a Triton GEMM's launch configs against cuBLAS, and a whole step replayed as a graph."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from benchmarks.engine.common import SHAPE, bench_ms, graph_ms

H, I = SHAPE.hidden, SHAPE.inter
PROJECTIONS = {"qkv": (H + 2 * SHAPE.kv_heads * SHAPE.head_dim, H), "o": (H, H), "gate_up": (2 * I, H),
               "down": (H, I), "lm_head": (SHAPE.vocab, H)}  # name: (N, K) of w [N, K]

Linear = Callable[[torch.Tensor, torch.Tensor, tuple, torch.Tensor], torch.Tensor]  # (x, w, config, workspace)


def sweep(rows: int, linear: Linear, candidates: Callable[[int, int], list[tuple]], workspace: torch.Tensor,
          log, rep_ms: int = 60) -> dict[str, tuple]:
    """The fastest config per projection at this many rows (every timing goes to log). candidates(n, k)."""
    best = {}
    for name, (n, k) in PROJECTIONS.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w)
        cublas_ms = bench_ms(lambda: F.linear(x, w))
        timed = []
        for cfg in candidates(n, k):
            try:
                err = (linear(x, w, cfg, workspace).float() - ref.float()).abs().max().item()
                timed.append((bench_ms(lambda: linear(x, w, cfg, workspace), rep_ms=rep_ms), cfg, err))
            except Exception as e:  # a config that does not compile or fit: report it, try the next
                log({"rows": rows, "shape": name, "config": cfg, "error": f"{type(e).__name__}: {e}"[:200]})
        if not timed:
            raise RuntimeError(f"no candidate config ran for {name} at {rows} rows")
        timed.sort(key=lambda t: t[0])
        ms, cfg, err = timed[0]
        best[name] = cfg
        flops = 2 * rows * n * k
        log({"rows": rows, "shape": name, "cublas_us": cublas_ms * 1e3, "best_us": ms * 1e3, "best": cfg,
             "max_abs_err": err, "weight_tb_s": n * k * 2 / ms / 1e9, "cublas_tflop_s": flops / cublas_ms / 1e9,
             "best_tflop_s": flops / ms / 1e9, "ratio_vs_cublas": cublas_ms / ms,
             "runners_up": [(round(t * 1e3, 1), c) for t, c, _ in timed[1:4]]})
    return best


def step_ms(rows: int, linear_for: Callable[[str], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]) -> float:
    """One CUDA-graph replay of a decode step's projections: 28 layers on distinct weights, then the LM head.
    linear_for(name) gives the (x, w) -> y function for that projection."""
    weights = {name: [torch.randn(*PROJECTIONS[name], device="cuda", dtype=torch.bfloat16) * 0.02
                      for _ in range(1 if name == "lm_head" else SHAPE.layers)] for name in PROJECTIONS}
    xs = {name: torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for name, (_, k) in PROJECTIONS.items()}
    fns = {name: linear_for(name) for name in PROJECTIONS}

    def step():
        for i in range(SHAPE.layers):
            for name in ("qkv", "o", "gate_up", "down"):
                fns[name](xs[name], weights[name][i])
        fns["lm_head"](xs["lm_head"], weights["lm_head"][0])
    return graph_ms(step)


def cublas_step_ms(rows: int) -> float:
    return step_ms(rows, lambda name: F.linear)
