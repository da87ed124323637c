#!/usr/bin/env python3
"""Prefill attention of a prompt chunk over a long cached prefix (the paged path), split-K against one split;
Qwen2.5-7B attention shape (28 query heads, 4 KV heads, head dim 128, bf16, KV pages of 16 tokens).

Cases: one chunk of 64-1,024 tokens after a cached prefix of 0-6,144 tokens, and a few calls of two chunks
(two sequences at different prefixes). Each case times, on scattered cache pages:
- the sweep: split counts 1, 2, 4, 8, 16 for each launch config (BLOCK_M 64/128, BLOCK_N 32/64, warps, stages);
- as the engine runs it: the tuned config and the automatic split count (`max_context` given);
and checks every variant against `prefill_attention_ref` (bf16 tolerance). Times are per layer (CUDA events,
L2 flushed between calls); ns/pair is the time of all 28 layers per (query, visible key) pair.
"Before" is the kernel as it ran before split-K: one split, BLOCK_M 128, BLOCK_N 64, 4 warps, 2 stages (the
first config; variants are named splits x BLOCK_M/BLOCK_N/warps w stages s).
Writes OUT/chunk_attention.json and prints the table last.

Example (H200): python benchmarks/engine/chunk_attention.py --out $OUT
CPU dry run (interpreter, fp32, tiny shapes): python benchmarks/engine/chunk_attention.py --out /tmp/chunk --small
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if "--small" in sys.argv:  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.common import SHAPE, Deadline, bench_ms, env_info, head_commit  # noqa: E402
from hosttune_engine.kernels import tuning  # noqa: E402
from hosttune_engine.kernels.prefill_attention import (  # noqa: E402
    auto_splits, config_key, default_config, prefill_attention, prefill_attention_ref)


@dataclass(frozen=True)
class Setup:
    hq: int
    hkv: int
    d: int
    page: int
    dtype: torch.dtype
    device: str
    chunks: tuple  # one case per (chunk, prefix) and per pair in `pairs`
    prefixes: tuple
    pairs: tuple  # ((chunk, prefix), (chunk, prefix)): two sequences in one call
    splits: tuple
    configs: tuple  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    tol: float


FULL = Setup(SHAPE.heads, SHAPE.kv_heads, SHAPE.head_dim, 16, torch.bfloat16, "cuda",
             chunks=(64, 128, 256, 512, 1024), prefixes=(4096, 2048, 6144, 1024, 0),
             pairs=(((256, 4096), (256, 1024)), ((512, 6144), (64, 2048)), ((128, 4096), (128, 4096)),
                    ((1024, 2048), (256, 6144))),
             splits=(1, 2, 4, 8, 16), tol=3e-2, configs=((128, 64, 4, 2), (64, 64, 4, 2), (128, 32, 4, 2),
                                                         (64, 32, 4, 2), (128, 64, 4, 3), (64, 64, 4, 3),
                                                         (128, 64, 8, 2)))
SMALL = Setup(4, 2, 32, 16, torch.float32, "cpu", chunks=(16, 40), prefixes=(0, 37), pairs=(((8, 50), (24, 24)),),
              splits=(1, 3), configs=((32, 16, 4, 2), (64, 32, 4, 1)), tol=1e-4)


@dataclass(frozen=True)
class Timing:
    name: str  # "SxBM/BN/WwSs" (splits x launch config), or "auto" (the engine's choice)
    splits: int
    config: dict
    ms: float  # one layer
    ns_per_pair: float  # all layers
    max_err: float


@dataclass(frozen=True)
class CaseResult:
    seqs: tuple  # ((chunk, prefix), ...)
    pairs: int
    timings: tuple

    def get(self, name: str) -> Timing:
        return next(t for t in self.timings if t.name == name)

    def best(self) -> Timing:
        return min((t for t in self.timings if t.name != "auto"), key=lambda t: t.ms)


class Case:
    """Queries of the chunks and a paged cache holding each sequence's prefix and chunk on scattered pages."""

    def __init__(self, setup: Setup, seqs: tuple, gen: torch.Generator):
        self.setup, self.seqs = setup, seqs
        s, dev = setup, setup.device
        ctx = [c + p for c, p in seqs]
        need = [-(-n // s.page) for n in ctx]
        perm = torch.randperm(sum(need) + 4, generator=gen)
        self.kc, self.vc = (torch.randn(sum(need) + 4, s.page, s.hkv, s.d, generator=gen).to(dev, s.dtype)
                            for _ in range(2))
        self.q = torch.randn(sum(c for c, _ in seqs), s.hq, s.d, generator=gen).to(dev, s.dtype)
        self.bt = torch.zeros(len(seqs), max(need), dtype=torch.int32)
        for i, n in enumerate(need):
            self.bt[i, :n] = perm[sum(need[:i]):sum(need[:i]) + n]
        self.bt = self.bt.to(dev)
        self.cu = torch.tensor([0] + [sum(c for c, _ in seqs[:i + 1]) for i in range(len(seqs))],
                               dtype=torch.int32, device=dev)
        self.lens = torch.tensor(ctx, dtype=torch.int32, device=dev)
        self.max_q, self.max_context = max(c for c, _ in seqs), max(ctx)
        self.pairs = sum(c * p + c * (c + 1) // 2 for c, p in seqs)

    def run(self, **kw):
        return prefill_attention(self.q, self.kc, self.vc, self.cu, self.lens, self.bt, self.max_q, **kw)

    def reference(self):
        return prefill_attention_ref(self.q, self.kc, self.vc, self.cu, self.lens, self.bt).float()

    def engine_config(self) -> dict:
        s = self.setup
        key = config_key(s.dtype, s.d, s.hq // s.hkv, s.page, False, self.max_q)
        return tuning.launch_config("prefill_attention", key, self.q.device, default_config(s.dtype, self.q.device))


CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def name(config: tuple) -> str:
    bm, bn, warps, stages = config
    return f"{bm}/{bn}/{warps}w{stages}s"


def time_ms(fn, on_cuda: bool) -> float:
    if on_cuda:
        return bench_ms(fn, rep_ms=20)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(case: Case, on_cuda: bool) -> CaseResult:
    s, ref = case.setup, case.reference()
    variants = {f"{n}x{name(c)}": dict(num_splits=n, config=dict(zip(CONFIG_KEYS, c))) for c in s.configs
                for n in s.splits}
    cfg = case.engine_config()
    tiles = -(-case.max_q // cfg["BLOCK_M"])
    auto = auto_splits(s.hq * tiles * len(case.seqs), case.max_context, cfg["BLOCK_N"], case.q.device)
    variants["auto"] = dict(max_context=case.max_context)
    timings = []
    for label, kw in variants.items():
        err = (case.run(**kw).float() - ref).abs().max().item()
        ms = time_ms(lambda: case.run(**kw), on_cuda)
        n, c = (auto, cfg) if label == "auto" else (kw["num_splits"], kw["config"])
        timings.append(Timing(label, n, c, ms, ms * 1e6 * SHAPE.layers / case.pairs, err))
    return CaseResult(case.seqs, case.pairs, tuple(timings))


def cases(setup: Setup) -> list[tuple]:
    return [((c, p),) for p in setup.prefixes for c in setup.chunks] + [tuple(pair) for pair in setup.pairs]


def table(results: list[CaseResult], before: str) -> str:
    lines = [f"{'chunk@prefix':>22} {'before ns/pair':>14} {'auto ns/pair':>12} {'auto':>15} {'speedup':>7} "
             f"{'best':>15} {'best ns/pair':>12}"]
    for r in results:
        b, a, best = r.get(before), r.get("auto"), r.best()
        auto = f"{a.splits}x{name(tuple(a.config[k] for k in CONFIG_KEYS))}"
        seqs = "+".join(f"{c}@{p}" for c, p in r.seqs)
        lines.append(f"{seqs:>22} {b.ns_per_pair:>14.2f} {a.ns_per_pair:>12.2f} {auto:>15} {b.ms / a.ms:>6.2f}x "
                     f"{best.name:>15} {best.ns_per_pair:>12.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="interpreter on the CPU, fp32, tiny shapes (a dry run)")
    parser.add_argument("--budget-s", type=float, default=170.0, help="cases that would start past it are left out")
    args = parser.parse_args()
    setup = SMALL if args.small else FULL
    on_cuda = setup.device == "cuda"
    before = f"1x{name(setup.configs[0])}"
    deadline, out = Deadline(args.budget_s), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"env": env_info(head_commit()), "setup": {**asdict(setup), "dtype": str(setup.dtype)},
              "before": before, "cases": []}
    gen, results = torch.Generator().manual_seed(0), []
    for seqs in cases(setup):
        if not deadline.allows(8):
            print(f"left out {seqs}: the time budget is spent")
            continue
        results.append(measure(Case(setup, seqs, gen), on_cuda))
        worst = max(t.max_err for t in results[-1].timings)
        report["cases"].append({**asdict(results[-1]), "ok": worst <= setup.tol})
        (out / "chunk_attention.json").write_text(json.dumps(report, indent=1))  # after every case
    bad = [c["seqs"] for c in report["cases"] if not c["ok"]]
    print(f"{len(results)} cases, every variant within {setup.tol} of the reference" if not bad
          else f"OFF THE REFERENCE (max abs error > {setup.tol}): {bad}")
    print(table(results, before))


if __name__ == "__main__":
    main()
