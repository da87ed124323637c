#!/usr/bin/env python3
"""The engine benchmark suite, in one run on one GPU: hardware ceilings, then
(a) prefill attention vs torch SDPA, (b) paged decode attention bandwidth, (c) fused
elementwise kernels' bandwidth, (d) decode tok/s vs the cuBLAS linear floor, (e) TTFT vs the
prefill compute floor, (f) offline throughput vs the roofline model and Hugging Face, (g) FP8 and
4-bit weights (quant_bench.py) against their weight-read rooflines, an FP8 linear floor and bf16, plus the
CUDA-graph and fp32 greedy correctness checks. Writes results.json (after every section) and
prints a table of ratios last.

Example: python benchmarks/engine/run_all.py --out /tmp/bench --commit $(git rev-parse --short HEAD) --tune
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

SECTIONS = ("kernels", "engine", "quant", "greedy", "hf")
WORKLOADS = ((256, 1024, 128), (256, 256, 512))  # offline throughput workloads: requests, in, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--tune", action="store_true", help="tune the attention kernels' launch configs first")
    parser.add_argument("--skip", nargs="*", default=[], choices=SECTIONS)
    parser.add_argument("--budget-s", type=float, default=540, help="sections that would not fit are skipped")
    parser.add_argument("--hf-limit-s", type=float, default=420)
    parser.add_argument("--quant-schemes", nargs="+", choices=("fp8", "awq", "fp8-kv8"),
                        help="the quant section's weight schemes (default: all of quant_bench's)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tune:  # tuned configs go to a table beside the results, which is read back at once
        os.environ.setdefault("HOSTTUNE_KERNEL_CONFIGS", str(out / "kernel_configs.json"))
    from benchmarks.engine.common import Deadline, env_info, measure_ceilings

    deadline = Deadline(args.budget_s)
    res = {"env": env_info(args.commit), "errors": {}}
    save = lambda: (out / "results.json").write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
    log = lambda obj: print(json.dumps(obj, default=_short), flush=True)  # noqa: E731
    log(res["env"])
    res["ceilings"] = measure_ceilings()
    log(res["ceilings"])
    save()
    for name, need_s, fn in (("kernels", 60, lambda: run_kernels(res, args.tune, log)),
                             ("engine", 90, lambda: run_engine(res, log, deadline)),
                             ("quant", 150, lambda: run_quant(res, log, args.quant_schemes)),
                             ("greedy", 40, lambda: run_greedy(res, log)),
                             ("hf", 45, lambda: run_hf(res, out, min(args.hf_limit_s, deadline.left() - 5)))):
        if name in args.skip or not deadline.allows(need_s):
            res.setdefault("skipped", []).append(name)
            continue
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # keep what the other sections measured
            traceback.print_exc()
            res["errors"][name] = f"{type(e).__name__}: {e}"[:1000]
        res.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        save()
    save()
    print_table(res)


def _short(x):
    return round(x, 4) if isinstance(x, float) else str(x)


def run_kernels(res: dict, tune: bool, log) -> None:
    import torch

    from benchmarks.engine import kernels

    name = torch.cuda.get_device_name(0)
    copy = res["ceilings"]["copy_tb_s"]
    res["prefill_attention"] = kernels.prefill_vs_sdpa(tune, name, log)
    res["decode_attention"] = kernels.decode_bandwidth(tune, name, log, copy)
    res["elementwise"] = kernels.elementwise_bandwidth(copy)
    log(res["elementwise"])
    res["gemv_b1"] = kernels.gemv_vs_cublas(copy, log)


def run_engine(res: dict, log, deadline) -> None:
    import torch

    from benchmarks.engine import engine_bench as eb

    t0 = time.perf_counter()
    engine = eb.build_engine()
    res["engine_start_s"] = time.perf_counter() - t0
    model = engine.runner.model
    res["lm_head"] = eb.lm_head_paths(model)
    log(res["lm_head"])
    res["graph_vs_eager"] = eb.graph_vs_eager(engine)
    log(res["graph_vs_eager"])
    res["decode"] = []
    for batch, sampled in ((1, False), (8, False), (16, False), (64, False), (64, True), (256, False)):
        row = eb.decode_rate(engine, batch, sampled=sampled)
        row.update(eb.linear_floor(model, batch))
        row["floor_tok_s"] = batch / row["floor_ms"] * 1e3
        row["ratio_vs_floor"] = row["tok_s"] / row["floor_tok_s"]
        res["decode"].append(row)
        log(row)
    res["profile"] = {f"decode_b{b}": eb.profile_decode(engine, b) for b in (1, 64, 256)}
    res["ttft"] = []
    for n in (128, 512, 1024, 4096):
        row = eb.ttft_ms(engine, n)
        row.update(eb.ttft_floor(n, res["ceilings"]))
        row["ratio_to_floor"] = row["ttft_ms"] / row["floor_ms"]
        res["ttft"].append(row)
        log(row)
    res["profile"]["prefill_4096"] = eb.profile_prefill(engine, 4096)
    log(res["profile"])
    res["host_profile"] = [eb.host_profile(engine, b) for b in (1, 64)]
    log(res["host_profile"])
    res["warmup"] = [eb.offline_throughput(engine, 64, 1024, 16), eb.offline_throughput(engine, 64, 256, 24)]
    log(res["warmup"])  # the workloads' shapes at a quarter of the requests: compile their kernel variants
    res["throughput"] = []
    for n_req, n_in, n_out in WORKLOADS:
        if not deadline.allows(40):
            break
        row = eb.offline_throughput(engine, n_req, n_in, n_out)
        row["roofline"] = eb.roofline(n_req, n_in, n_out, res["ceilings"]["copy_tb_s"], res["ceilings"]["gemm_tflop_s"])
        row["ratio_vs_roofline"] = row["output_tok_s"] / row["roofline"]["model_tok_s"]
        row["ratio_vs_refined_roofline"] = row["output_tok_s"] / row["roofline"]["refined_tok_s"]
        res["throughput"].append(row)
        log(row)
    del engine, model
    torch.cuda.empty_cache()


def run_quant(res: dict, log, schemes: list[str] | None) -> None:
    from benchmarks.engine import quant_bench

    plan = quant_bench.Plan(schemes=tuple(schemes)) if schemes else quant_bench.Plan()
    quant_bench.run_quant(res, log, plan)


def run_greedy(res: dict, log) -> None:
    from benchmarks.engine import greedy_check

    res["greedy_fp32"] = greedy_check.fast_vs_reference()
    log(res["greedy_fp32"])


def run_hf(res: dict, out: Path, limit_s: float) -> None:
    path = out / "hf.json"
    cmd = [sys.executable, str(HERE / "hf_baseline.py"), "--out", str(path),
           *(f"--workload={n}:{i}:{o}" for n, i, o in WORKLOADS)]
    t0 = time.perf_counter()
    try:
        subprocess.run(cmd, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired:
        res["errors"]["hf"] = f"stopped at the {limit_s:.0f} s limit"
    res["hf"] = json.loads(path.read_text()) if path.is_file() else {}
    res["hf"]["wall_s"] = time.perf_counter() - t0


def print_table(res: dict) -> None:
    print("\n| measurement | ours | reference | ratio | target |\n| --- | --- | --- | --- | --- |")
    c = res.get("ceilings", {})
    print(f"| copy bandwidth / bf16 GEMM 8192^3 | {c.get('copy_tb_s', 0):.2f} TB/s | {c.get('gemm_tflop_s', 0):.0f} TFLOP/s | | |")
    for r in res.get("prefill_attention", []):
        target = "≥ 0.90" if r["tokens"] >= 4096 and r["mode"] == "contiguous" else ""
        graph = f" (GPU only, graph replay: {r['graph_ratio_vs_sdpa']:.2f})" if "graph_ratio_vs_sdpa" in r else ""
        print(f"| prefill attention {r['tokens']} tok ({r['mode']}) | {r['ours_tflop_s']:.0f} TFLOP/s | "
              f"SDPA {r['sdpa_tflop_s']:.0f} TFLOP/s | {r['ratio_vs_sdpa']:.2f}{graph} | {target} |")
    for r in res.get("decode_attention", []):
        print(f"| decode attention b{r['batch']} ctx {r['context']} ({r['num_splits']} splits) | "
              f"{r['tb_s']:.2f} TB/s ({r['us']:.1f} us) | copy {c['copy_tb_s']:.2f} TB/s | "
              f"{r['fraction_of_copy_bw']:.2f} | |")
    for r in res.get("elementwise", []):
        print(f"| {r['kernel']} {r['tokens']} tok | {r['tb_s']:.2f} TB/s | copy | {r['fraction_of_copy_bw']:.2f} | |")
    g1 = res.get("gemv_b1")
    if g1:
        print(f"| batch-1 step GEMMs, Triton GEMV {g1['best']} | {g1['best_tb_s']:.2f} TB/s ({g1['best_ms']:.2f} ms) | "
              f"cuBLAS {g1['cublas_tb_s']:.2f} TB/s ({g1['cublas_ms']:.2f} ms) | {g1['ratio_vs_cublas']:.2f} | |")
    for r in res.get("decode", []):
        target = "" if r.get("sampled") else {1: "≥ 0.90", 64: "≥ 0.80"}.get(r["batch"], "")
        kind = f", sampled {r['sampled']}" if r.get("sampled") else ""
        print(f"| decode b{r['batch']} (ctx ≤ {r['context_max']}{kind}) | {r['tok_s']:.0f} tok/s ({r['step_ms']:.2f} ms/step, "
              f"graph {r['graph_replay_ms'] or 0:.2f} ms) | floor {r['floor_tok_s']:.0f} tok/s ({r['floor_ms']:.2f} ms) | "
              f"{r['ratio_vs_floor']:.2f} | {target} |")
    for r in res.get("ttft", []):
        target = "≤ 1.20" if r["prompt_tokens"] == 4096 else ""
        print(f"| TTFT {r['prompt_tokens']} tok | {r['ttft_ms']:.1f} ms | floor {r['floor_ms']:.1f} ms "
              f"({r.get('floor_bound', 'FLOPs')}) | "
              f"{r['ratio_to_floor']:.2f} | {target} |")
    for r in res.get("throughput", []):
        rf = r["roofline"]
        print(f"| throughput {r['requests']}x({r['in']} in/{r['out']} out) | {r['output_tok_s']:.0f} tok/s "
              f"({r['seconds']:.2f} s) | roofline {rf['model_tok_s']:.0f} (refined {rf['refined_tok_s']:.0f}) | "
              f"{r['ratio_vs_roofline']:.2f} ({r['ratio_vs_refined_roofline']:.2f}) | ≥ 0.75 |")
        ru = r["runner"]
        print(f"| ... where the time went | graph steps {ru['graph_steps']} in {ru['graph_s']:.2f} s, eager steps "
              f"{ru['eager_steps']} in {ru['eager_s']:.2f} s (slowest {ru['slowest_step_s'] * 1e3:.0f} ms); steps with "
              f"prefill {ru['prefill_steps']} in {ru['prefill_s']:.2f} s, decode-only {ru['decode_steps']} in "
              f"{ru['decode_s']:.2f} s; outside the "
              f"runner {r['outside_runner_s']:.2f} s | model: prefill {rf['prefill_s']:.2f} s + decode {rf['decode_s']:.2f} s "
              f"| kernels compiled: {r['kernels_compiled']} | |")
    if res.get("quant"):
        from benchmarks.engine import quant_bench

        print("\n".join(quant_bench.table_rows(res)))
    hf = res.get("hf", {})
    b1, ours_b1 = hf.get("generate_batch1", {}), next((r for r in res.get("decode", []) if r["batch"] == 1), None)
    if b1 and "error" not in b1:
        mine = f"{ours_b1['tok_s']:.0f} tok/s (decode b1)" if ours_b1 else ""  # none with --skip engine
        ratio = f"{ours_b1['tok_s'] / b1['tok_s']:.1f}x" if ours_b1 else ""
        print(f"| HF generate b1 (prompt {b1['prompt_tokens']}, {b1['new_tokens']} tokens) | "
              f"{mine} | {b1['tok_s']:.1f} tok/s | {ratio} | |")
    else:
        print(f"| HF generate b1 | | {b1.get('error', 'not run')} | | |")
    ours = {(r["requests"], r["in"], r["out"]): r for r in res.get("throughput", [])}
    for v in hf.get("generate_batch_cb", []):
        if "error" in v:
            print(f"| HF generate_batch | | {v['error']} | | |")
            continue
        mine = ours.get((v["requests"], v["in"], v["out"]))
        ratio = f"{mine['output_tok_s'] / v['output_tok_s']:.1f}x" if mine else ""
        print(f"| HF generate_batch {v['requests']}x({v['in']} in/{v['out']} out) | "
              f"{mine['output_tok_s']:.0f} tok/s | {v['output_tok_s']:.0f} tok/s ({v['seconds']:.0f} s) | {ratio} | |"
              if mine else f"| HF generate_batch {v['requests']}x({v['in']}/{v['out']}) | | "
              f"{v['output_tok_s']:.0f} tok/s | | |")
    if not hf.get("generate_batch_cb"):
        print("| HF generate_batch | | not run | | |")
    g = res.get("graph_vs_eager")
    if g:
        print(f"| CUDA graph vs eager logits (bf16, b{g['batch']}) | max abs {g['max_abs_diff']:.3g}, "
              f"rel {g['rel_l2']:.2g} | argmax equal {sum(g['argmax_equal'])}/{g['batch']} | | |")
    gr = res.get("greedy_fp32")
    if gr:
        cells = ", ".join(f"{r['prompt_tokens']}: {r['agree']}/{r['of']}" for r in gr["rows"])
        print(f"| greedy fp32, fast path vs torch reference | {cells} | | {'equal' if gr['all_equal'] else 'DIFFER'} | equal |")
    if res.get("errors"):
        print("errors:", json.dumps(res["errors"])[:2000])
    if res.get("skipped"):
        print("skipped:", res["skipped"])


if __name__ == "__main__":
    main()
