#!/usr/bin/env python3
"""Time to healthy of the engine server, phase by phase, and whether its warmup left anything to build.

Starts `python -m hosttune_engine serve` (Qwen2.5-7B shape, bf16 dummy weights, the step budget on, as
tail_latency.py's "new" server) `--runs` times in a row. For each start: the seconds from the process's
start to /health 200, and to each phase the server logs (listening, engine code imported, model loaded,
KV pool sized, decode / prefill / mixed-step graphs captured, warmup with its groups, step costs, ready);
how many Triton kernel variants it built while starting and how long they took (a first start on a
machine compiles them, later ones load them from Triton's compile cache under the user's home); then, on
the ready server, one streaming request per prompt length one after another (their TTFTs), a burst of
closed-loop streaming users with the default length mix, the same single requests again (the warm
TTFTs), and `hosttune:kernel_compiles_total` from /metrics: variants built while serving, each one a shape
warmup missed (the server's log names them). Writes OUT/results.json and each start's server log, and
prints a table last.

Example (H200): python benchmarks/engine/startup.py --out $OUT
CPU dry run (a tiny model): python benchmarks/engine/startup.py --out /tmp/startup --small
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.tail_latency import (SETTINGS, first_ttfts, numbers, spec, start_server, stop,  # noqa: E402
                          wait_healthy, write_model)

from hosttune.bench.benchmark import measure  # noqa: E402
from hosttune.bench.loadgen import Load  # noqa: E402
from hosttune.bench.metrics import summarize  # noqa: E402

PHASES = (  # (name, what the server logs when the phase ends)
    ("listening", r"listening on "), ("imports", r"engine code imported in "), ("model", r"model loaded in "),
    ("kv_pool", r"KV pool sized in "),
    ("decode_graphs", r"decode graphs captured in "), ("prefill_graphs", r"prefill graphs captured in "),
    ("mixed_graphs", r"mixed-step graphs captured in "), ("warmup", r"warmup done in "),
    ("step_costs", r"step costs measured in "), ("ready", r"ready: serving "),
)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def phase_times(log: str, started: float) -> dict[str, float]:
    """Seconds from the process's start (a `time.time()`) to the log line that ends each phase."""
    out = {}
    for line in log.splitlines():
        stamp = STAMP.match(line)
        if not stamp:
            continue
        for name, pattern in PHASES:
            if name not in out and re.search(pattern, line):
                at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out[name] = round(at - started, 2)
    return out


def start_builds(log: str) -> dict | None:
    found = re.search(r"(\d+) kernel variants built during start, ([\d.]+) s of it", log)
    return {"variants": int(found.group(1)), "seconds": float(found.group(2))} if found else None


def warmup_groups(log: str) -> dict[str, float]:
    found = re.search(r"warmup done in [\d.]+ s \((.*)\)", log)
    return {name: float(s) for name, s in (g.rsplit(" ", 1) for g in found.group(1).split(", "))} if found else {}


def serving_builds(log: str) -> list[tuple[str, int]]:
    """(kernel, milliseconds) of each variant the server warned it built once ready."""
    return [(name, int(ms)) for name, ms in re.findall(r"kernel (\S+) was built while serving \((\d+) ms", log)]


def compiles_while_serving(url: str) -> int | None:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        found = re.search(r"^hosttune:kernel_compiles_total\{[^}]*\} ([\d.e+]+)$", response.read().decode(), re.M)
    return int(float(found.group(1))) if found else None


async def burst(args, url: str) -> dict:
    load = Load(users=args.users, duration=args.burst_s, warmup=0.0, drain_timeout=15, seed=2)
    return numbers(summarize(await measure(spec(args, load), url)))


def one_start(args, folder: Path, out: Path, i: int) -> dict:
    log = out / f"server-{i}.log"
    started = time.time()
    proc = start_server(folder, log, args.small, list(SETTINGS["new"]))
    try:
        url, healthy = wait_healthy(proc, log, args.ready_timeout)
        entry = {"seconds_to_healthy": round(healthy, 1)}
        first = first_ttfts(url, args.small)
        entry["burst"] = asyncio.run(burst(args, url))
        warm = first_ttfts(url, args.small)
        entry["first_ttft_ms"] = {"after_healthy": first, "warm": warm}
        entry["kernel_compiles_while_serving"] = compiles_while_serving(url)
        text = log.read_text()
        entry.update(phases_s=phase_times(text, started), kernel_builds_at_start=start_builds(text),
                     warmup_groups_s=warmup_groups(text),
                     built_while_serving=serving_builds(text))
        return entry
    finally:
        stop(proc)


def table(runs: list[dict]) -> str:
    head = f"{'start':5} {'healthy s':>9} {'built at start':>15} {'built serving':>13} {'TTFT first/warm':>15} " \
           f"{'burst TTFT p95':>14}  phases (s from process start)"
    lines = [head, "-" * len(head)]
    for i, r in enumerate(runs):
        builds = r.get("kernel_builds_at_start") or {}
        ttft = r.get("first_ttft_ms", {})
        ratio = max((a / b for a, b in zip(ttft.get("after_healthy", []), ttft.get("warm", [])) if b), default=None)
        phases = " ".join(f"{k} {v:g}" for k, v in r.get("phases_s", {}).items())
        lines.append(f"{i:<5} {r.get('seconds_to_healthy', '-'):>9} "
                     f"{builds.get('variants', '-')!s:>6} in {builds.get('seconds', '-')!s:>5} s "
                     f"{r.get('kernel_compiles_while_serving', '-')!s:>13} "
                     f"{'-' if ratio is None else f'{ratio:.2f}x':>15} "
                     f"{(r.get('burst') or {}).get('ttft_p95_ms', '-')!s:>11} ms  {phases}")
    lines.append("targets: healthy <= 15 s once kernels are in the compile cache; first TTFTs at warm levels; "
                 "0 built while serving")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "startup-out"))
    parser.add_argument("--small", action="store_true", help="a tiny model on CPU: dry-run the script")
    parser.add_argument("--runs", type=int, default=3, help="starts in a row (the first may fill the compile cache)")
    parser.add_argument("--users", type=int, help="streaming users of the burst (64; --small 4)")
    parser.add_argument("--burst-s", type=float, help="seconds of the burst (15; --small 3)")
    parser.add_argument("--ready-timeout", type=float, default=240)
    args = parser.parse_args()
    args.users = args.users or (4 if args.small else 64)
    args.burst_s = args.burst_s or (3.0 if args.small else 15.0)
    args.prompts = "mix:0.3*uniform:8-32+0.7*normal:200,40,100-400" if args.small else "chat-docs"
    args.max_tokens = 16 if args.small else 512
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = write_model(Path(tempfile.mkdtemp(prefix="startup-model-")), args.small)
    results = {"model": "tiny, CPU" if args.small else "Qwen2.5-7B shape, bf16 dummy weights",
               "flags": SETTINGS["new"], "users": args.users, "burst_s": args.burst_s, "runs": []}
    for i in range(args.runs):
        results["runs"].append(one_start(args, folder, out, i))
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(results["runs"]))


if __name__ == "__main__":
    main()
