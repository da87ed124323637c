#!/usr/bin/env python3
"""Host time of one `Engine.step` of steady decode, with the model stubbed out (CPU, no GPU needed).

The engine is a tiny model on the CPU. Its decode steps go through the same padded buffers as the
CUDA-graph path (`DecodeGraphs` with `use_graphs=False`), but the graph body is a stub that returns
fixed logits [b, V], so what is timed is the host work alone: scheduling, block accounting, input
packing, the token list, stop checks, detokenization and `TokenOutput`s. Prompts are 128 tokens and
every request decodes greedily with `ignore_eos`, as in engine_bench.decode_rate. Prints the median,
mean and p90 per step in microseconds, with and without a tokenizer (the benchmark's dummy model has
none; a served model has one).

Not all of that host time keeps a GPU waiting: the engine builds step N's outputs while step N+1 runs.
`gap_*` is the part that does, per step: from the return of `runner.collect` for step N (the sync on its
tokens) to the start of step N+1's graph body (where the replay would be enqueued). A step launched ahead,
before step N is collected (steady greedy decode), has no such gap: the device holds it queued behind step
N, and waits only if a whole step's host time is longer than the step's device time. `ahead` counts those.

Example: PYTHONPATH=engine python benchmarks/engine/host_overhead.py --batch 64 --steps 300 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import pstats
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest

ROOT = Path(__file__).resolve().parents[2]


def tiny_model(root: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_tiny_models", ROOT / "engine" / "scripts" / "make_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_models(root)["qwen2"]


def plain_token(model: Path) -> int:
    """A token that decodes to a plain word, so each step's text is complete (not a partial UTF-8 byte)."""
    from hosttune_engine.model.tokenizer import Tokenizer

    tok = Tokenizer(model)
    return next(i for i in range(tok.vocab_size) if re.fullmatch(r" ?[a-z]{2,}", tok.decode([i])))


@dataclass
class Marks:
    """In order, with perf_counter times: each step call's start ("call"), each graph body's start ("launch")
    and each collect's return ("collect")."""

    events: list[tuple[str, float]] = field(default_factory=list)

    def gaps_us(self, steps: int) -> list[float]:
        """For each of the last `steps` launches, the GPU-idle gap before it: the time since the collect just
        before it in the same call, or 0 for a launch that comes first in its call (ahead of the collect)."""
        gaps = []
        for (kind, t), (before, t_before) in zip(self.events[1:], self.events):
            if kind == "launch":
                gaps.append((t - t_before) * 1e6 if before == "collect" else 0.0)
        return gaps[-steps:]


def stubbed_engine(model: Path, tokenizer: bool, prefix_caching: bool, token: int) -> tuple[Engine, Marks]:
    """A CPU engine whose decode steps run the padded graph buffers around a stub model: fixed logits."""
    no_tok = tempfile.mkdtemp(prefix="no-tokenizer-")
    engine = Engine(EngineConfig(model=str(model), device="cpu", dtype="float32", block_size=16, max_num_seqs=256,
                                 num_kv_blocks=8192, max_model_len=1024, enable_prefix_caching=prefix_caching,
                                 tokenizer=None if tokenizer else no_tok))
    runner = engine.runner
    graphs = runner.build_decode_graphs(use_graphs=False, max_batch=256)
    logits = torch.zeros(graphs.max_batch, runner.model_config.vocab_size)  # [B, V]
    logits[:, token] = 1.0
    marks = Marks()

    def stub(ids, pos, meta):
        marks.events.append(("launch", time.perf_counter()))
        return logits[: ids.shape[0]]

    def collect(launched):
        result = collect_step(launched)
        marks.events.append(("collect", time.perf_counter()))
        return result

    graphs.step_fn = stub
    runner.graphs = graphs
    collect_step, runner.collect = runner.collect, collect
    return engine, marks


def time_steps(engine: Engine, marks: Marks, batch: int, steps: int, warmup: int, profile: bool) -> dict:
    gen = torch.Generator().manual_seed(batch)
    vocab = engine.model_config.vocab_size
    for i, ids in enumerate(torch.randint(3, vocab, (batch, 128), generator=gen).tolist()):
        params = SamplingParams(temperature=0, max_tokens=steps + warmup + 8, ignore_eos=True)
        engine.add_request(EngineRequest(f"r{i}", ids, params))
    for _ in range(warmup):  # the prefill step(s) run the tiny model; then decode
        engine.step()
    assert engine.scheduler.num_running == batch and not engine.scheduler.waiting
    prof = cProfile.Profile() if profile else None
    times = []
    for _ in range(steps):
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        marks.events.append(("call", t0))
        outs = engine.step()
        times.append(time.perf_counter() - t0)
        if prof:
            prof.disable()
        assert len(outs) == batch
    us = sorted(t * 1e6 for t in times)
    gaps = sorted(marks.gaps_us(steps))
    row = {"batch": batch, "steps": steps, "median_us": statistics.median(us), "mean_us": statistics.fmean(us),
           "p90_us": us[int(0.9 * len(us))], "gap_median_us": statistics.median(gaps),
           "gap_mean_us": statistics.fmean(gaps), "gap_p90_us": gaps[int(0.9 * len(gaps))],
           "ahead": sum(1 for g in gaps if g == 0.0)}
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions (slows the steps)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_model(Path(tempfile.mkdtemp(prefix="tiny-models-")))
    for tokenizer in (False, True):
        engine, marks = stubbed_engine(model, tokenizer, args.prefix_caching, token=plain_token(model))
        row = time_steps(engine, marks, args.batch, args.steps, args.warmup, args.profile)
        row.update(tokenizer=tokenizer, prefix_caching=args.prefix_caching)
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
