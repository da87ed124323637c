#!/usr/bin/env python3
"""Where the time to first token of a short prompt goes (H200, Qwen2.5-7B shape, idle engine).

For each prompt length: TTFT (median of 5, as run_all.py measures it) against its floor, the GPU time of
the prefill's kernels (torch profiler), and the host's wall time of the step split by function (cProfile):
a short prefill's ~250 launches can take the host longer than the GPU takes to run them.
Example: PYTHONPATH=engine python benchmarks/engine/short_prompt.py --lengths 32 128 512 --out /tmp/short.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
from pathlib import Path

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine import engine_bench as eb
from benchmarks.engine.common import measure_ceilings


def host_profile(engine, prompt_len: int, top: int = 12) -> str:
    """cProfile of one prefill of this length through Engine.step (warm), by total time."""
    prof = cProfile.Profile()
    eb._add(engine, eb._prompts(1, prompt_len, seed=3), max_tokens=1)
    prof.enable()
    eb._drain(engine)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 256, 512, 1024])
    parser.add_argument("--out", default="short_prompt.json")
    args = parser.parse_args()
    ceilings = measure_ceilings()
    engine = eb.build_engine()
    rows = []
    for n in args.lengths:
        row = {**eb.ttft_ms(engine, n), **eb.ttft_floor(n, ceilings)}
        row["gpu"] = eb.profile_prefill(engine, n)
        row["host_profile"] = host_profile(engine, n)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "host_profile"}, default=str)[:1500], flush=True)
        print(row["host_profile"], flush=True)
        Path(args.out).write_text(json.dumps({"ceilings": ceilings, "rows": rows}, indent=1))
    print("| prompt | TTFT | floor | ratio | GPU kernels |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['prompt_tokens']} | {r['ttft_ms']:.1f} ms | {r['floor_ms']:.1f} ms ({r['floor_bound']}) | "
              f"{r['ttft_ms'] / r['floor_ms']:.2f} | {r['gpu']['total_us'] / 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
