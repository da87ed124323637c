#!/usr/bin/env python3
"""The sampler after a decode step, on one GPU: greedy, temperature, top-k, top-p, top-k with top-p.

`Sampler.sample` (top-k or top-p by the rejection race, `kernels.race`) against the sampling it replaced:
top-k and top-p by a full sort of the vocabulary, then the race over what is left, with the same noise.
Logits are random fp32 [batch, 152,064] (the Qwen2.5-7B vocabulary), scaled so a row's distribution is
spread like a model's; each mode also counts how often both ways picked the same token. With --engine it
also runs decode at batch 64 through `Engine.step`, greedy and sampled (engine_bench.SAMPLED); with
--sweep it times the race kernel's launch configs (columns a program, warps) instead, checking that each
picks the same tokens. Prints JSON lines, then a table.

Example: PYTHONPATH=engine python benchmarks/engine/sampler_bench.py --engine
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401
from benchmarks.engine.common import SHAPE, bench_ms  # noqa: E402

from hosttune_engine.kernels.race import launch_config, race_sample  # noqa: E402
from hosttune_engine.layers.sampler import Sampler, SamplingBatch, sort_sample  # noqa: E402
from hosttune_engine.sampling import SamplingParams  # noqa: E402

MODES = {
    "greedy": {"temperature": 0},
    "temperature 0.8": {"temperature": 0.8},
    "top-k 50": {"temperature": 0.8, "top_k": 50},
    "top-p 0.95": {"temperature": 0.8, "top_p": 0.95},
    "top-p 0.5": {"temperature": 0.8, "top_p": 0.5},
    "top-k 50 + top-p 0.95": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
    "top-k 20 + top-p 0.8 (Qwen2.5's defaults)": {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
}


def by_sort(logits: torch.Tensor, noise: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The sampler before the race by rejection: sort, mask, softmax, race."""
    sampled = sort_sample(logits, noise, batch.temperatures, batch.top_k, batch.top_p)
    return torch.where(batch.greedy, logits.argmax(dim=-1), sampled)


def sampler_row(batch: int, params: dict) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(batch)
    logits = torch.randn(batch, SHAPE.vocab, device="cuda", generator=gen) * 4
    settings = SamplingBatch.build([SamplingParams(**params)] * batch, [None] * batch, SHAPE.vocab, "cuda")
    sampler = Sampler()
    row = {"batch": batch, "ours_ms": bench_ms(lambda: sampler.sample(logits, settings))}
    if settings.all_greedy:
        return row
    noise = torch.empty_like(logits).exponential_()
    row["sort_ms"] = bench_ms(lambda: by_sort(logits, noise, settings))
    row["speedup"] = row["sort_ms"] / row["ours_ms"]
    torch.manual_seed(0)
    ours = sampler.sample(logits, settings).tokens
    torch.manual_seed(0)  # the same noise: the sampler draws it first, from the global generator
    noise = torch.empty_like(logits).exponential_()
    row["same_token"] = float((ours == by_sort(logits, noise, settings)).float().mean())
    return row


SWEEP_MODES = {"top-p 0.95": (None, 0.95), "top-k 50": (50, 1.0), "top-k 50 + top-p 0.95": (50, 0.95)}


def sweep_rows(batch: int) -> list[dict]:
    """The race kernel alone under each (columns, warps), against the config `launch_config` picks."""
    gen = torch.Generator(device="cuda").manual_seed(batch)
    logits = torch.randn(batch, SHAPE.vocab, device="cuda", generator=gen) * 4
    noise = torch.empty_like(logits).exponential_(generator=gen)
    temperature = torch.full((batch,), 0.8, device="cuda")
    rows = []
    for mode, (k, p) in SWEEP_MODES.items():
        settings = (temperature, torch.full((batch,), k or SHAPE.vocab, device="cuda"),
                    torch.full((batch,), p, device="cuda"))
        chosen = race_sample(logits, noise, *settings)
        for config in [(block, warps) for block in (1024, 2048, 4096) for warps in (4, 8, 16)]:
            ms = bench_ms(lambda: race_sample(logits, noise, *settings, config=config))
            same = bool(torch.equal(race_sample(logits, noise, *settings, config=config), chosen))
            rows.append({"batch": batch, "mode": mode, "config": config, "ms": ms, "same_token": same,
                         "picked": config == launch_config(batch)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def print_sweep(rows: list[dict]) -> None:
    print("\n| race kernel, batch | launch_config (ms) | best config | best (ms) | all configs same tokens |")
    print("| --- | --- | --- | --- | --- |")
    for key in dict.fromkeys((r["batch"], r["mode"]) for r in rows):
        group = [r for r in rows if (r["batch"], r["mode"]) == key]
        picked, best = next(r for r in group if r["picked"]), min(group, key=lambda r: r["ms"])
        print(f"| {key[1]}, b{key[0]} | {picked['ms']:.3f} {tuple(picked['config'])} | {tuple(best['config'])} | "
              f"{best['ms']:.3f} | {all(r['same_token'] for r in group)} |")


def decode_rows() -> list[dict]:
    from benchmarks.engine import engine_bench as eb

    engine = eb.build_engine()
    return [eb.decode_rate(engine, 64, sampled=sampled) for sampled in (False, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="*", default=[1, 8, 32, 64, 256])
    parser.add_argument("--engine", action="store_true", help="also decode at batch 64 through Engine.step")
    parser.add_argument("--sweep", action="store_true", help="time the race kernel's launch configs instead")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    if args.sweep:
        rows = [r for batch in args.batch for r in sweep_rows(batch)]
        if args.out:
            Path(args.out).write_text(json.dumps({"sweep": rows}, indent=1))
        print_sweep(rows)
        return
    rows = []
    for batch in args.batch:
        for name, params in MODES.items():
            rows.append({"mode": name, **sampler_row(batch, params)})
            print(json.dumps(rows[-1]), flush=True)
    decode = decode_rows() if args.engine else []
    for row in decode:
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"sampler": rows, "decode": decode}, indent=1))
    print("\n| sampling, batch | Sampler.sample (ms) | by sort (ms) | speedup | same token |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        sort = f"{r['sort_ms']:.3f} | {r['speedup']:.1f}x | {r['same_token']:.3f}" if "sort_ms" in r else "| |"
        print(f"| {r['mode']}, b{r['batch']} | {r['ours_ms']:.3f} | {sort} |")
    for r in decode:
        kind = f"sampled {r['sampled']}" if r["sampled"] else "greedy"
        print(f"| decode b64 through Engine.step, {kind} | {r['step_ms']:.2f} ms/step ({r['tok_s']:.0f} tok/s), "
              f"graph {r['graph_replay_ms']:.2f} ms | | | |")


if __name__ == "__main__":
    main()
