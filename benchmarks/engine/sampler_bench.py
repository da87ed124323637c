#!/usr/bin/env python3
"""The sampler after a decode step, on one GPU: greedy, temperature, top-k, top-p, with the engine's
sort-free top-k/top-p (`Sampler.sample`) against the same sampling with top-k/top-p by a full sort of
the vocabulary (how the sampler did it before). Logits are random fp32 [batch, 152,064], the
Qwen2.5-7B vocabulary. With --engine it also runs decode at batch 64 through `Engine.step`, greedy and
sampled (engine_bench.SAMPLED). Prints JSON lines, then a table.

Example: PYTHONPATH=engine python benchmarks/engine/sampler_bench.py --engine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHAPE, bench_ms  # noqa: E402

from hosttune_engine.layers.sampler import Sampler, SamplingBatch  # noqa: E402
from hosttune_engine.sampling import SamplingParams  # noqa: E402

MODES = {
    "greedy": {"temperature": 0},
    "temperature 0.8": {"temperature": 0.8},
    "top-k 50": {"temperature": 0.8, "top_k": 50},
    "top-p 0.95": {"temperature": 0.8, "top_p": 0.95},
    "top-k 50 + top-p 0.95": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
}


def sort_filter(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                max_top_k: int | None = None) -> torch.Tensor:
    """Top-k and top-p by sorting every row (the reference the sort-free path replaces)."""
    values, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        values = values.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    if top_p is not None:
        probs = values.softmax(dim=-1)
        values = values.masked_fill(probs.cumsum(dim=-1) - probs > top_p[:, None], float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, values)


def sampler_ms(batch: int, params: dict) -> dict:
    logits = torch.randn(batch, SHAPE.vocab, device="cuda") * 3
    settings = SamplingBatch.build([SamplingParams(**params)] * batch, [None] * batch, SHAPE.vocab, "cuda")
    sampler = Sampler()
    ours = bench_ms(lambda: sampler.sample(logits, settings))
    import hosttune_engine.layers.sampler as module

    sort_free, module.filter_top_k_top_p = module.filter_top_k_top_p, sort_filter
    try:
        by_sort = bench_ms(lambda: sampler.sample(logits, settings))
    finally:
        module.filter_top_k_top_p = sort_free
    return {"batch": batch, "ours_ms": ours, "sort_ms": by_sort, "speedup": by_sort / ours}


def decode_rows() -> list[dict]:
    import engine_bench as eb

    engine = eb.build_engine()
    return [eb.decode_rate(engine, 64, sampled=sampled) for sampled in (False, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="*", default=[64, 256])
    parser.add_argument("--engine", action="store_true", help="also decode at batch 64 through Engine.step")
    args = parser.parse_args()
    rows = []
    for batch in args.batch:
        for name, params in MODES.items():
            rows.append({"mode": name, **sampler_ms(batch, params)})
            print(json.dumps(rows[-1]), flush=True)
    decode = decode_rows() if args.engine else []
    for row in decode:
        print(json.dumps(row), flush=True)
    print("\n| sampling, batch | sort-free (ms) | full sort (ms) | speedup |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']}, b{r['batch']} | {r['ours_ms']:.3f} | {r['sort_ms']:.3f} | {r['speedup']:.1f}x |")
    for r in decode:
        kind = f"sampled {r['sampled']}" if r["sampled"] else "greedy"
        print(f"| decode b64 through Engine.step, {kind} | {r['step_ms']:.2f} ms/step ({r['tok_s']:.0f} tok/s) | "
              f"graph {r['graph_replay_ms']:.2f} ms | |")


if __name__ == "__main__":
    main()
