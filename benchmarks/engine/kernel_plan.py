#!/usr/bin/env python3
"""The engine's ratios under each source of kernel launch configs: the shipped table, a table that
`hosttune-engine tune` writes into an empty cache on this GPU (its wall time recorded), or no table at all.

Each variant runs run_all.py's engine and quant sections in a process of its own, so the tables one run
reads cannot leak into the next. Writes DIR/VARIANT/results.json (and DIR/tuned/cache, the tuned table)
and prints, last, one table over every variant found under DIR, so the variants may be run one call at a time.

Example: python benchmarks/engine/kernel_plan.py --out /tmp/plan --commit $(git rev-parse --short HEAD) \
    --variants tuned shipped
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

VARIANTS = ("shipped", "tuned", "none")
# The tune's budget per weight format (seconds): enough for each format's decode and prefill shapes.
TUNE_BUDGET_S = {"bf16": 10.0, "fp8": 40.0, "awq": 60.0}
# run_all ratios compared across variants: (label, how to read it from results.json)
MEASURES = (
    ("bf16 decode b1 / floor", lambda r: _decode(r, 1, "ratio_vs_floor")),
    ("bf16 decode b64 / floor", lambda r: _decode(r, 64, "ratio_vs_floor")),
    ("TTFT 4K / floor", lambda r: _ttft(r, 4096, "ratio_to_floor")),
    ("bf16 256x(1024/128) / roofline", lambda r: _throughput(r, 1024, "ratio_vs_roofline")),
    ("fp8 decode b1 tok/s", lambda r: _quant(r, "fp8", "b1", "tok_s")),
    ("fp8 decode b64 / fp8 floor", lambda r: _quant(r, "fp8", "batched", "ratio_vs_floor")),
    ("fp8 TTFT 4K / bf16", lambda r: _quant(r, "fp8", "ttft", "ratio_vs_bf16")),
    ("fp8 256x(1024/128) tok/s", lambda r: _quant(r, "fp8", "throughput", "output_tok_s")),
    ("awq decode b1 tok/s", lambda r: _quant(r, "awq", "b1", "tok_s")),
    ("awq decode b64 tok/s", lambda r: _quant(r, "awq", "batched", "tok_s")),
    ("awq 256x(1024/128) tok/s", lambda r: _quant(r, "awq", "throughput", "output_tok_s")),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-kernel-plan")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--budget-s", type=float, default=300, help="each variant's run_all budget")
    args = parser.parse_args()
    out = Path(args.out)
    for variant in args.variants:
        run_variant(variant, out, args)
    print_table(out)


def run_variant(variant: str, out: Path, args: argparse.Namespace) -> None:
    folder = out / variant
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["HOSTTUNE_ENGINE_CACHE"] = str(folder / "cache")  # empty unless this variant tunes into it
    env["HOSTTUNE_KERNEL_CONFIGS"] = str(folder / "no-user-table.json")
    if variant != "shipped":
        env["HOSTTUNE_ENGINE_SHIPPED_TABLE"] = "off"
    if variant == "tuned":
        tune(folder, env)
    cmd = [sys.executable, str(HERE / "run_all.py"), "--out", str(folder), "--commit", args.commit,
           "--skip", "kernels", "greedy", "hf", "--quant-schemes", "fp8", "awq", "--budget-s", str(args.budget_s)]
    print(f"== {variant}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, env=env, check=False)


def tune(folder: Path, env: dict) -> None:
    """`hosttune-engine tune` for each weight format into the variant's empty cache; wall time recorded."""
    from benchmarks.engine.common import QWEN25_7B, model_folder

    model = model_folder(QWEN25_7B)
    runs = []
    t0 = time.perf_counter()
    for fmt, budget in TUNE_BUDGET_S.items():
        cmd = [sys.executable, "-m", "hosttune_engine", "tune", "--model", model, "--budget-s", str(budget)]
        if fmt != "bf16":
            cmd += ["--quantization", fmt]
        t = time.perf_counter()
        done = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True)
        print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", flush=True)
        runs.append({"format": fmt, "budget_s": budget, "rc": done.returncode,
                     "wall_s": round(time.perf_counter() - t, 1), "report": done.stdout[-4000:]})
    record = {"wall_s": round(time.perf_counter() - t0, 1), "runs": runs}
    (folder / "tune.json").write_text(json.dumps(record, indent=1))


def _decode(r: dict, batch: int, key: str):
    return next((d[key] for d in r.get("decode", []) if d.get("batch") == batch and not d.get("sampled")), None)


def _ttft(r: dict, tokens: int, key: str):
    return next((d.get(key) for d in r.get("ttft", []) if d.get("prompt_tokens") == tokens), None)


def _throughput(r: dict, n_in: int, key: str):
    return next((d.get(key) for d in r.get("throughput", []) if d.get("in") == n_in), None)


def _quant(r: dict, scheme: str, row: str, key: str):
    q = next((q for q in r.get("quant", []) if q["scheme"] == scheme), {})
    return q.get(row, {}).get(key)


def print_table(out: Path) -> None:
    results = {v: json.loads((out / v / "results.json").read_text()) for v in VARIANTS
               if (out / v / "results.json").is_file()}
    tunes = {v: json.loads((out / v / "tune.json").read_text()) for v in results if (out / v / "tune.json").is_file()}
    for v, t in tunes.items():
        parts = ", ".join(f"{r['format']} {r['wall_s']} s rc {r['rc']}" for r in t["runs"])
        print(f"{v}: tune wall {t['wall_s']} s ({parts})")
    print("\n| measure | " + " | ".join(results) + " |\n| --- |" + " --- |" * len(results))
    base = results.get("shipped")
    for label, read in MEASURES:
        cells = []
        for r in results.values():
            value = read(r)
            ref = read(base) if base else None
            rel = f" ({value / ref:.3f}x)" if value is not None and ref and r is not base else ""
            cells.append("-" if value is None else f"{value:.3f}{rel}" if value < 10 else f"{value:.0f}{rel}")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
