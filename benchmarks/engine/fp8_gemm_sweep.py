#!/usr/bin/env python3
"""The batched FP8 GEMM paths on the Qwen2.5-7B projections (activations already e4m3 per token), per batch
size: torch._scaled_mm with unit scales plus the scale epilogue ("unit"), cuBLAS's row-wise scales
("rowwise"), and the Triton FP8 GEMM with the scales in its epilogue ("triton", kernels/fp8_gemm.py) over a
sweep of its launch configs. Prints each projection's times and the best config; with --table, the entries
for kernels/tuned_configs.json: `fp8_mm` METHOD "triton" and its `fp8_gemm` config for each projection shape
and batch bucket where it was faster than both at every batch size measured in the bucket. For gate_up it also
times, at that best config, the GEMM with SwiGLU and the FP8 quantization after it in its epilogue
(`fp8_gemm_swiglu`) against the GEMM then `swiglu_fp8`, and its entry says SWIGLU 1 where the fused form was
faster at every batch measured in the bucket. The launches of a timed graph cycle through copies of the weight
(three times the L2 together), so every launch reads its weight from memory, as a model's step does; with one
copy the small projections' weights stay in L2 and time 20-25% faster than a step runs them.

Example: python benchmarks/engine/fp8_gemm_sweep.py --out /tmp/fp8-gemm.json --table
         python benchmarks/engine/fp8_gemm_sweep.py --batches 64 --projections qkv o down --fast-acc 1
         python benchmarks/engine/fp8_gemm_sweep.py --batches 64 --fast-acc 1 --warps 4 8 --precompile 14
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import multiprocessing
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.engine.common import QWEN25_7B, per_launch_us  # noqa: E402

H, INTER = QWEN25_7B["hidden_size"], QWEN25_7B["intermediate_size"]
PROJECTIONS = {"qkv": (4608, H), "o": (H, H), "gate_up": (2 * INTER, H), "down": (H, INTER)}  # N, K
BATCHES = (16, 32, 64, 128)
LAUNCHES = 20  # per graph replay, so the replay's own cost is shared


@dataclass(frozen=True)
class Axes:
    """The launch-config values swept, every combination of them."""
    block_n: tuple = (32, 64, 128)
    block_k: tuple = (128, 256)
    stages: tuple = (3, 4, 5, 6)
    warps: tuple = (4,)
    fast_acc: tuple = (0, 1)


def configs(m: int, axes: Axes = Axes()):
    block_m = max(16, min(64, 1 << (m - 1).bit_length()))
    for bn, bk, stages, warps, fast in itertools.product(axes.block_n, axes.block_k, axes.stages, axes.warps,
                                                         axes.fast_acc):
        yield {"BLOCK_M": block_m, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages,
               "FAST_ACC": fast}


def measure(m: int, n: int, k: int, axes: Axes = Axes()) -> dict:
    from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_ref
    from hosttune_engine.kernels.fp8_scaled_mm import fp8_mm, quantize_per_token

    xq, sx = quantize_per_token(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    weights = [_weight(n, k) for _ in range(_copies(n * k))]
    w = weights[0]
    ws, one = torch.rand(n, device="cuda") * 0.01, torch.ones((), device="cuda")
    row = {"m": m, "n": n, "k": k, "weight_copies": len(weights)}

    def launches(fn):  # each launch of a graph on the next weight copy: read from memory, as in a model's step
        calls = itertools.cycle(weights)
        return per_launch_us(lambda: fn(next(calls)), LAUNCHES)

    for method in ("unit", "rowwise"):
        row[f"{method}_us"] = launches(lambda wc: fp8_mm(xq, sx, wc, ws, None, one, method == "rowwise",
                                                         torch.bfloat16))
    swept = []
    for i, c in enumerate(configs(m, axes)):
        try:
            us = launches(lambda wc: fp8_gemm(xq, sx, wc, ws, None, torch.bfloat16, c))
            swept.append((us, i, c))
        except triton.runtime.errors.OutOfResources:  # too much shared memory for its stages
            continue
    swept.sort()
    row["triton_us"], _, row["config"] = swept[0]
    row["runners_up"] = [{"us": us, "config": c} for us, _, c in swept[1:4]]
    want = fp8_gemm_ref(xq, sx, w, ws, None, torch.float32)
    got = fp8_gemm(xq, sx, w, ws, None, torch.bfloat16, row["config"]).float()
    row["rel_error"] = ((got - want).norm() / want.norm()).item()
    if takes_swiglu(n, k, row["config"]):
        row.update(swiglu_us(xq, sx, w, ws, row["config"]))
    return row


def takes_swiglu(n: int, k: int, cfg: dict) -> bool:
    """Whether the sweep also times this launch with SwiGLU in its epilogue: gate_up, with tiles wide enough for
    fp8_gemm_swiglu's halves."""
    return (n, k) == PROJECTIONS["gate_up"] and cfg["BLOCK_N"] >= 32


def precompile_with(compile_one, jobs: list[tuple[int, int, int, dict]], workers: int) -> None:
    """Compile every (m, n, k, config) launch first, compile_one(m, n, k, config) in `workers` processes at once
    (Triton's on-disk cache keeps the kernels), so the sweep itself only loads and times them."""
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.starmap(_compile_share, [(compile_one, jobs[i::workers]) for i in range(workers)])


def _compile_share(compile_one, jobs) -> None:
    for m, n, k, cfg in jobs:
        try:
            compile_one(m, n, k, cfg)
        except triton.runtime.errors.OutOfResources:
            continue
    torch.cuda.synchronize()


@functools.lru_cache(maxsize=8)
def _operands(m: int, n: int, k: int):
    from hosttune_engine.kernels.fp8_scaled_mm import quantize_per_token

    xq, sx = quantize_per_token(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    return xq, sx, _weight(n, k), torch.rand(n, device="cuda")


def _compile(m: int, n: int, k: int, cfg: dict) -> None:
    from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_swiglu

    xq, sx, w, ws = _operands(m, n, k)
    fp8_gemm(xq, sx, w, ws, None, torch.bfloat16, cfg)
    if takes_swiglu(n, k, cfg):
        fp8_gemm_swiglu(xq, sx, w, ws, None, torch.bfloat16, cfg)


def _weight(n: int, k: int) -> torch.Tensor:
    return torch.randn(n, k, device="cuda").mul(50).clamp(-448, 448).to(torch.float8_e4m3fn)


def _copies(weight_bytes: int) -> int:
    """Weight copies enough that a graph cycling through them reads each from memory, not from the L2 the
    launch before left it in (three times the L2 together, at most LAUNCHES)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(LAUNCHES, -(-3 * l2 // weight_bytes)))


def swiglu_us(xq, sx, w, ws, cfg: dict) -> dict:
    """gate_up and the SwiGLU with its FP8 quantization after it: fused into the GEMM, and apart."""
    from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_swiglu
    from hosttune_engine.kernels.fp8_inputs import swiglu_fp8

    return {"swiglu_fused_us": per_launch_us(lambda: fp8_gemm_swiglu(xq, sx, w, ws, None, torch.bfloat16, cfg),
                                             LAUNCHES),
            "swiglu_apart_us": per_launch_us(lambda: swiglu_fp8(fp8_gemm(xq, sx, w, ws, None, torch.bfloat16, cfg)),
                                             LAUNCHES)}


def table(rows: list[dict]) -> dict:
    """tuned_configs.json entries (bf16 activations): per projection shape and batch bucket, METHOD "triton"
    and its config (that of the bucket's largest batch measured) where it beat both cuBLAS paths at every
    batch measured in the bucket; SWIGLU 1 in it where the fused SwiGLU was faster at every one of them."""
    from hosttune_engine.kernels.tuning import batch_bucket

    groups: dict = {}
    for r in rows:
        groups.setdefault(f"bfloat16-{batch_bucket(r['m'])}-{r['n']}x{r['k']}", []).append(r)
    methods, gemm = {}, {}
    for key, rs in groups.items():
        if all(r["triton_us"] < min(r["unit_us"], r["rowwise_us"]) for r in rs):
            methods[key] = {"METHOD": "triton"}
            gemm[key] = dict(max(rs, key=lambda r: r["m"])["config"])
            if all(r.get("swiglu_fused_us", float("inf")) < r.get("swiglu_apart_us", 0.0) for r in rs):
                gemm[key]["SWIGLU"] = 1
    return {"fp8_mm": methods, "fp8_gemm": gemm}


def sweep_arguments(parser: argparse.ArgumentParser, out: str, batches, block_k, stages) -> None:
    """The options every GEMM sweep takes: output, batches, projections, K tiles, stages, --table, --precompile."""
    parser.add_argument("--out", default=out)
    parser.add_argument("--batches", type=int, nargs="+", default=list(batches))
    parser.add_argument("--projections", nargs="+", choices=list(PROJECTIONS), default=list(PROJECTIONS))
    parser.add_argument("--block-k", type=int, nargs="+", default=list(block_k), help="BLOCK_K values")
    parser.add_argument("--stages", type=int, nargs="+", default=list(stages), help="num_stages values")
    parser.add_argument("--table", action="store_true", help="print the tuned-table entries")
    parser.add_argument("--precompile", type=int, default=0, metavar="N",
                        help="compile every config in N processes before timing any (0: compile as timed)")


def run_sweep(args, axes, configs, measure, table, compile_one) -> None:
    """Precompile (with --precompile), measure(m, n, k, axes) every batch and projection (a JSON line each), the
    table from the rows (with --table), all written to --out."""
    if args.precompile:
        precompile_with(compile_one, [(m, *PROJECTIONS[name], c) for m in args.batches for name in args.projections
                                      for c in configs(m, axes)], args.precompile)
    rows = []
    for m in args.batches:
        for name in args.projections:
            n, k = PROJECTIONS[name]
            rows.append({"projection": name, **measure(m, n, k, axes)})
            print(json.dumps(rows[-1]), flush=True)
    res = {"device": torch.cuda.get_device_name(), "rows": rows}
    if args.table:
        res["table"] = table(rows)
        print(json.dumps(res["table"], indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sweep_arguments(parser, "fp8-gemm-sweep.json", BATCHES, Axes.block_k, Axes.stages)
    parser.add_argument("--fast-acc", type=int, nargs="+", default=list(Axes.fast_acc), choices=(0, 1),
                        help="FAST_ACC values to sweep (1: the MMA accumulates along K)")
    parser.add_argument("--block-n", type=int, nargs="+", default=list(Axes.block_n), help="BLOCK_N values")
    parser.add_argument("--warps", type=int, nargs="+", default=list(Axes.warps), help="num_warps values")
    args = parser.parse_args()
    axes = Axes(tuple(args.block_n), tuple(args.block_k), tuple(args.stages), tuple(args.warps),
                tuple(args.fast_acc))
    run_sweep(args, axes, configs, measure, table, _compile)


if __name__ == "__main__":
    main()
