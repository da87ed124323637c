"""`hosttune-engine tune`: tune the kernels a model's plan runs on this GPU and cache the table."""

from __future__ import annotations

import argparse
import math
import time

import torch

from hosttune_engine.config import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS, activation_dtype, check_block_size
from hosttune_engine.errors import ConfigError
from hosttune_engine.kernels import tuning
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.checks import planned_shard
from hosttune_engine.plan.launch import LaunchConfig
from hosttune_engine.plan.gpus import present_gpu
from hosttune_engine.planner.build import PlanInputs, check_runs
from hosttune_engine.planner.command import add_tensor_parallel_argument
from hosttune_engine.planner.tables import check_tables
from hosttune_engine.quant.spec import resolve_spec
from hosttune_engine.tuner.run import Tuning, tune_model


def add_parser(commands) -> None:
    p = commands.add_parser("tune", help="tune the kernels a model runs on this GPU; the engine reads the table at start",
                            description="Time each planned kernel's candidate launch configs on this GPU within a "
                                        "time budget and write the winners to the tuned-table cache "
                                        f"(${tuning.CACHE_ENV}, default ~/.cache/hosttune-engine), keyed by GPU "
                                        "name, driver and Triton version. Reads config.json only. Example: "
                                        "hosttune-engine tune --model /models/qwen2.5-7b --budget-s 300")
    p.add_argument("--model", required=True, help="Hugging Face model folder (config.json is enough)")
    p.add_argument("--budget-s", type=float, default=300.0, help="seconds of sweeping (the seeds of each sweep "
                                                                  "run past it)")
    p.add_argument("--quantization", help="as serve's --quantization, one of " + ", ".join(QUANTIZATIONS) + ": tune "
                                          "for FP8 at load, or for a layout's dummy weights")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="as serve's: the activations' dtype ('auto': float16 for a float16 checkpoint, else bfloat16)")
    p.add_argument("--block-size", type=int, default=16,
                   help="as serve's: tokens per KV-cache block (decode attention's entries are per size)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="as serve's: 'fp8' tunes decode attention on an e4m3 cache, whose entries are its own")
    add_tensor_parallel_argument(p, "tune the shards one rank runs (its projections' N x K and its heads), whose "
                                    "entries are their own")
    p.add_argument("--if-missing", action="store_true",
                   help="tune only if this GPU, driver and Triton have no cached table for these weights yet")


def tune_from_args(args: argparse.Namespace) -> str:
    """Tune, write the cache, and return the report."""
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):  # NaN would pass `<= 0` and sweep nothing
        raise ConfigError(f"--budget-s {args.budget_s}: give seconds (> 0)")
    check_block_size(args.block_size)
    cfg = ModelConfig.from_folder(args.model)  # the model and its quantization first: a typo shows on any machine
    load_format = "dummy" if args.quantization is not None else "auto"  # plan and tune name any layout
    spec = resolve_spec(cfg.quantization, args.quantization, load_format, args.model)
    dtype_name = activation_dtype(args.dtype, cfg.dtype, on_cuda=True)
    dtype, tp = getattr(torch, dtype_name), args.tensor_parallel_size
    shard = planned_shard(cfg, tp, dtype, spec)  # a size the model does not split, as plain a typo as the model's
    if not torch.cuda.is_available():
        raise ConfigError("tune times kernels on this machine's GPU, and it has none: run it on the GPU host "
                          "that serves the model")
    gpu = present_gpu(torch.device("cuda"))
    fp8_kv = args.kv_cache_dtype == "fp8"
    inputs = PlanInputs(cfg, gpu, dtype, spec, kv_cache_fp8=fp8_kv, block_size=args.block_size, shard=shard)
    check_runs(inputs)  # what plan and serve refuse on this GPU, before a budget goes on configs that cannot compile
    check_tables(gpu.name)  # a table plan and serve refuse is not merged as empty and overwritten after the budget
    key, weights = tuning.present_key(gpu.name), _tuned_for(spec, dtype_name, args.block_size, fp8_kv, tp)
    tuned_for = tuning.cached_about(key).get("tuned_for", [])
    if args.if_missing and weights in tuned_for:
        return (f"{gpu.name} has a table tuned for {_described(weights)} on this driver and Triton: "
                f"{tuning.cache_path(key)}")
    tuning.check_cache_writable()  # the table is written after the whole budget
    start = time.perf_counter()
    done = tune_model(inputs, args.budget_s)
    wall_s = time.perf_counter() - start
    merged = tuning.cached_table(key)
    for kernel, entries in done.table.items():
        merged.setdefault(kernel, {}).update(entries)
    about = {"tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "tuned_for": sorted(set(tuned_for) | {weights})}
    return report(done, wall_s, str(tuning.write_cached_table(key, merged, about)))


def _tuned_for(spec, dtype_name: str, block_size: int, fp8_kv: bool = False, tensor_parallel_size: int = 1) -> str:
    """What a table's `tuned_for` list names these weights by: the layout (bf16 unquantized), then after slashes the
    activations' dtype unless bfloat16, the KV block size unless 16, kv8 for an e4m3 cache and tpN for a rank's
    shards of N (the tables key entries by each: a shard's shapes and heads are its own)."""
    weights = spec.layout.value if spec is not None else "bf16"
    dtype = "" if dtype_name == "bfloat16" else f"/{dtype_name}"
    tp = "" if tensor_parallel_size == 1 else f"/tp{tensor_parallel_size}"
    return weights + dtype + ("" if block_size == 16 else f"/paged{block_size}") + ("/kv8" if fp8_kv else "") + tp


def _described(tuned_for: str) -> str:
    """'awq/float16/paged32/kv8' in words: awq weights, float16 activations, KV blocks of 32, an e4m3 KV cache."""
    weights, *rest = tuned_for.split("/")
    return ", ".join([f"{weights} weights"] + [_part(p) for p in rest])


def _part(part: str) -> str:
    if part == "kv8":
        return "an e4m3 KV cache"
    if part.startswith("tp"):
        return f"{part.removeprefix('tp')}-way tensor-parallel shards"
    return f"KV blocks of {part.removeprefix('paged')}" if part.startswith("paged") else f"{part} activations"


def report(done: Tuning, wall_s: float, path: str) -> str:
    lines = []
    for r in done.sweeps:
        best = r.best
        result = (f"{best.ms * 1e3:9.1f} us  {LaunchConfig.from_table(best.config, r.kernel)}" if best else
                  "no candidate ran: " + " ".join(next((t.error for t in r.tried if t.error), "none tried").split()))
        lines.append(f"{r.kernel:>16}  {', '.join(r.cases):<40} {len(r.tried):3d} tried, {r.skipped:3d} left  {result}")
    entries = sum(len(v) for v in done.table.values())
    lines.append(f"{entries} {'entry' if entries == 1 else 'entries'} tuned in {wall_s:.0f} s; table {path}")
    return "\n".join(lines)
