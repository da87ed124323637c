#!/usr/bin/env python3
"""Quantized weights on the Qwen2.5-7B-shaped dummy model: FP8 (quantized at load, one scale per output
channel) and 4-bit (AWQ layout, groups of 128), each weight quantized by the checkpoint writer's code.

Rows, each beside its floor measured in the same run: FP8 decode b1 vs the FP8 weight-read roofline
(the bytes of every matrix a step reads, over the copy bandwidth); FP8 decode b64 vs an FP8 linear-layer
floor (every projection as one FP8 tensor-core GEMM and the bf16 LM head, one CUDA graph, as the bf16
floor is measured); FP8 TTFT of a 4K prompt vs bf16's; AWQ decode b1 vs its weight-read roofline and b64
vs bf16's; every scheme's decode b16 vs bf16's; 256 x (1024 in / 128 out) throughput for both. "fp8-kv8" is the FP8 engine with its KV cache in
e4m3 too (`kv_cache_dtype="fp8"`): the same rows, and both FP8 engines also decode b64 over 2K-token contexts,
where the cache, not the weights, is most of what a step reads. run_all.py runs this as its `quant` section,
after the bf16 rows it is compared with; alone it measures the bf16 rows itself.

Example: python benchmarks/engine/quant_bench.py --out /tmp/bench-quant
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

import torch  # noqa: E402

from benchmarks.engine.common import QWEN25_7B, graph_ms, measure_ceilings, model_folder  # noqa: E402

TARGETS = {"fp8_b1_vs_roofline": 0.85, "fp8_b64_vs_floor": 0.80, "fp8_ttft_vs_bf16": 0.70, "awq_b1_vs_roofline": 0.70}


@dataclass(frozen=True)
class Plan:
    """What to measure, on which model; the default is the H200 run, tests pass a tiny one."""

    config: dict = field(default_factory=lambda: QWEN25_7B)
    engine: dict = field(default_factory=dict)  # EngineConfig options over engine_bench.build_engine's
    batch: int = 64
    small_batch: int = 16  # a second batched decode row, against bf16 at the same batch
    ttft_tokens: int = 4096
    workload: tuple[int, int, int] = (256, 1024, 128)
    schemes: tuple[str, ...] = ("fp8", "awq", "fp8-kv8")
    long_context: int = 2048  # the FP8 engines' second b64 decode row


# scheme -> (the engine's quantization, its other options)
SCHEMES = {"fp8": ("fp8", {}), "awq": ("awq", {}), "fp8-kv8": ("fp8", {"kv_cache_dtype": "fp8"})}


def build(plan: Plan, quantization: str | None, **extra):
    from hosttune_engine import Engine, EngineConfig

    options = {"load_format": "dummy", "dtype": "bfloat16", "kernel_backend": "triton", "max_model_len": 8192,
               "num_kv_blocks": 24576, "max_num_seqs": 256, "enable_prefix_caching": False, **plan.engine, **extra}
    return Engine(EngineConfig(model=model_folder(plan.config), quantization=quantization, **options))


def step_bytes(model) -> int:
    """Bytes a batch-1 decode step reads from its matrices: every projection's stored tensors (quantized
    values, scales, zeros, FP8 scale-row indices; the 4-bit column order only where it is not plain), and the
    LM head."""
    from hosttune_engine.quant.quant_linear import QuantLinear

    total = model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    for m in model.modules():
        if isinstance(m, QuantLinear) or (isinstance(m, torch.nn.Linear) and m is not model.lm_head):
            total += sum(t.numel() * t.element_size() for n, t in m.named_buffers(recurse=False)
                         if n != "perm" or m.permuted)
            total += sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
    return total


def timed_ms(fn, reps: int = 15) -> float:
    """One call of fn() replayed as a CUDA graph on a GPU; eager wall time elsewhere."""
    if torch.cuda.is_available():
        return graph_ms(fn, reps)
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def fp8_linear_floor(model, batch: int) -> dict:
    """Every FP8 projection of a step at this batch as the fastest FP8 GEMM there is (torch._scaled_mm,
    per-tensor unit scales, activations already in e4m3), and the bf16 LM head, in one CUDA graph."""
    from hosttune_engine.kernels.fp8_scaled_mm import supports_fp8_mm
    from hosttune_engine.quant.fp8_linear import Fp8Linear

    device = model.lm_head.weight.device
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    inputs = {k: torch.randn(batch, k, device=device).to(torch.float8_e4m3fn) for k in {m.in_features for m in layers}}
    hidden = torch.randn(batch, model.lm_head.in_features, device=device, dtype=model.lm_head.weight.dtype)
    one = torch.ones((), device=device)
    fast = supports_fp8_mm(device)

    def step():
        for m in layers:
            x = inputs[m.in_features]
            if fast:
                torch._scaled_mm(x, m.weight.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            else:  # no FP8 tensor cores: the same products in bf16 (a lower bound only on such a GPU)
                x.to(hidden.dtype) @ m.weight.to(hidden.dtype).t()
        torch.nn.functional.linear(hidden, model.lm_head.weight)
    return {"floor_ms": timed_ms(step), "fp8_tensor_cores": fast}


def roofline(model, copy_tb_s: float) -> dict:
    nbytes = step_bytes(model)
    ms = nbytes / copy_tb_s / 1e9
    return {"step_gb": nbytes / 1e9, "roofline_ms": ms, "roofline_tok_s": 1e3 / ms}


def measure_scheme(plan: Plan, scheme: str, copy_tb_s: float, log) -> dict:
    from benchmarks.engine import engine_bench as eb

    t0 = time.perf_counter()
    quantization, options = SCHEMES[scheme]
    engine = build(plan, quantization, **options)
    kv = engine.runner.kv_shape
    row = {"scheme": scheme, "engine_start_s": time.perf_counter() - t0,
           "kv_bytes_per_token": kv.bytes_per_block // kv.block_size}
    model = engine.runner.model
    row["b1"] = {**eb.decode_rate(engine, 1), **roofline(model, copy_tb_s)}
    row["b1"]["ratio_vs_roofline"] = row["b1"]["tok_s"] / row["b1"]["roofline_tok_s"]
    log(row["b1"])
    row["batched"] = b = eb.decode_rate(engine, plan.batch)
    if plan.small_batch:
        row["batched_small"] = eb.decode_rate(engine, plan.small_batch)
        log(row["batched_small"])
    if quantization == "fp8":
        b.update(fp8_linear_floor(model, plan.batch))
        b["ratio_vs_floor"] = b["tok_s"] / (plan.batch / b["floor_ms"] * 1e3)
        row["batched_long"] = eb.decode_rate(engine, plan.batch, prompt_len=plan.long_context)
        log(row["batched_long"])
        row["ttft"] = eb.ttft_ms(engine, plan.ttft_tokens)
    log(b)
    if torch.cuda.is_available():  # where the step's time goes, kernel by kernel, at both batch sizes
        row["profile"] = {f"decode_b{n}": eb.profile_decode(engine, n) for n in (1, plan.batch)}
    if "ttft" in row:
        log(row["ttft"])
    n_req, n_in, n_out = plan.workload
    eb.offline_throughput(engine, max(1, n_req // 4), n_in, max(2, n_out // 8))  # compile its kernel variants
    row["throughput"] = eb.offline_throughput(engine, n_req, n_in, n_out)
    log(row["throughput"])
    del engine, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def bf16_rows(plan: Plan, log) -> dict:
    """The bf16 rows the quantized ones are compared with, when run_all's engine section did not run."""
    from benchmarks.engine import engine_bench as eb

    engine = build(plan, None)
    rows = {"ttft": [eb.ttft_ms(engine, plan.ttft_tokens)],
            "decode": [eb.decode_rate(engine, n) for n in (1, plan.small_batch, plan.batch) if n]}
    n_req, n_in, n_out = plan.workload
    eb.offline_throughput(engine, max(1, n_req // 4), n_in, max(2, n_out // 8))
    rows["throughput"] = [eb.offline_throughput(engine, n_req, n_in, n_out)]
    log(rows)
    del engine
    return rows


def run_quant(res: dict, log, plan: Plan = Plan()) -> None:
    """Fill res["quant"] (one row per scheme); res needs "ceilings" and, for the ratios to bf16, the bf16
    "ttft" and "throughput" rows (run_all's engine section, or bf16_rows)."""
    res["quant"] = [measure_scheme(plan, s, res["ceilings"]["copy_tb_s"], log) for s in plan.schemes]
    bf16_ttft = next((r["ttft_ms"] for r in res.get("ttft", []) if r["prompt_tokens"] == plan.ttft_tokens), None)
    for row in res["quant"]:
        if "ttft" in row and bf16_ttft:
            row["ttft"]["ratio_vs_bf16"] = row["ttft"]["ttft_ms"] / bf16_ttft


def table_rows(res: dict) -> list[str]:
    """The quantized rows of run_all's ratio table."""
    lines = []
    bf16_tp = {(r["requests"], r["in"], r["out"]): r["output_tok_s"] for r in res.get("throughput", [])}
    bf16_decode = {r["batch"]: r["tok_s"] for r in res.get("decode", []) if not r.get("sampled")}
    for row in res.get("quant", []):
        s, b1 = row["scheme"], row["b1"]
        target = TARGETS["fp8_b1_vs_roofline" if s.startswith("fp8") else "awq_b1_vs_roofline"]
        lines.append(f"| {s} decode b1 | {b1['tok_s']:.0f} tok/s ({b1['step_ms']:.2f} ms/step) | weight-read roofline "
                     f"{b1['roofline_tok_s']:.0f} tok/s ({b1['step_gb']:.2f} GB) | {b1['ratio_vs_roofline']:.2f} | "
                     f"≥ {target:.2f} |")
        if "batched_small" in row:
            lines.append(_bf16_row(s, row["batched_small"], bf16_decode))
        b = row.get("batched")
        if b and "floor_ms" in b:
            lines.append(f"| {s} decode b{b['batch']} | {b['tok_s']:.0f} tok/s ({b['step_ms']:.2f} ms/step) | FP8 "
                         f"linear floor {b['floor_ms']:.2f} ms | {b['ratio_vs_floor']:.2f} | ≥ 0.80 |")
        elif b:
            lines.append(_bf16_row(s, b, bf16_decode))
        if "batched_long" in row:
            lines.append(_long_row(row, res))
        if "ttft" in row:
            t = row["ttft"]
            ratio = f"{t['ratio_vs_bf16']:.2f}" if "ratio_vs_bf16" in t else ""
            lines.append(f"| {s} TTFT {t['prompt_tokens']} tok | {t['ttft_ms']:.1f} ms | bf16 | {ratio} | ≤ 0.70 |")
        tp = row["throughput"]
        bf16 = bf16_tp.get((tp["requests"], tp["in"], tp["out"]))
        lines.append(f"| {s} throughput {tp['requests']}x({tp['in']} in/{tp['out']} out) | {tp['output_tok_s']:.0f} "
                     f"tok/s | {_against_bf16(tp['output_tok_s'], bf16)} | |")
    return lines


def _against_bf16(tok_s: float, bf16: float | None) -> str:
    """The reference and ratio cells: bf16's tok/s and the ratio, or that bf16 was not measured in this run."""
    return f"bf16 {bf16:.0f} tok/s | {tok_s / bf16:.2f}" if bf16 else "bf16 not measured in this run |"


def _bf16_row(scheme: str, b: dict, bf16_decode: dict) -> str:
    """A batched decode row against bf16's at the same batch."""
    return (f"| {scheme} decode b{b['batch']} | {b['tok_s']:.0f} tok/s ({b['step_ms']:.2f} ms/step) | "
            f"{_against_bf16(b['tok_s'], bf16_decode.get(b['batch']))} | |")


def _long_row(row: dict, res: dict) -> str:
    """b64 over long contexts, beside the FP8 engine with the cache in bf16."""
    b = row["batched_long"]
    ref = next((r["batched_long"] for r in res["quant"] if r["scheme"] == "fp8"), b)
    return (f"| {row['scheme']} decode b{b['batch']}, {b['context_max']}-token contexts | {b['tok_s']:.0f} tok/s "
            f"({b['step_ms']:.2f} ms/step, {row['kv_bytes_per_token']} KV bytes/token) | fp8, bf16 KV "
            f"{ref['tok_s']:.0f} tok/s | {b['tok_s'] / ref['tok_s']:.2f} | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-quant")
    parser.add_argument("--skip-bf16", action="store_true", help="no bf16 rows (no ratios to bf16)")
    parser.add_argument("--schemes", nargs="+", choices=list(SCHEMES), default=list(Plan().schemes),
                        help="which quantized engines to measure")
    parser.add_argument("--batch", type=int, default=Plan().batch, help="the batched decode rows' batch size")
    parser.add_argument("--small-batch", type=int, default=Plan().small_batch,
                        help="a second batched decode row's batch size (0: none)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda obj: print(json.dumps(obj, default=str), flush=True)  # noqa: E731
    res = {"ceilings": measure_ceilings()}
    log(res["ceilings"])
    plan = Plan(batch=args.batch, small_batch=args.small_batch, schemes=tuple(args.schemes))
    if not args.skip_bf16:
        res.update(bf16_rows(plan, log))
    run_quant(res, log, plan)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    print("\n| measurement | ours | reference | ratio | target |\n| --- | --- | --- | --- | --- |")
    print("\n".join(table_rows(res)))


if __name__ == "__main__":
    main()
