#!/usr/bin/env python3
"""Host and GPU time of one mixed step (a prefill chunk beside decodes), eager against piecewise graphs
(`core.mixed_graphs`), per step shape; Qwen2.5-7B shape, bf16 dummy weights.

Per shape (decodes at a 1,024-token context beside one prompt chunk at context 0) and per path:
- host: wall time of `ModelRunner.launch` from an idle device, i.e. the CPU time to pack the inputs and
  enqueue the step (the device runs what is enqueued meanwhile);
- gpu: the step's device time with the host out of the way: the device first sleeps long enough for the
  host to enqueue the whole step, then CUDA events time the step's work;
- step: launch to tokens on the host from an idle device, the latency a decode sees in this step.
The graph path runs in the bucket the default list gives; a shape past the largest default bucket runs on a
bucket of its own (its token count rounded up to 16), marked "+", to show what graphs would give there. Each shape
also compares the graph path's logits with the eager path's (bf16: a tolerance, and argmax agreement).
The capture time of the default bucket list (part of the time to /health 200) is measured first.
Writes OUT/mixed_step.json and prints the table last.

Example (H200): python benchmarks/engine/mixed_step.py --out $OUT
CPU dry run (a tiny model): python benchmarks/engine/mixed_step.py --out /tmp/mixed --small
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.common import QWEN25_7B, Deadline, env_info, head_commit, model_folder, sync

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.mixed_graphs import mixed_sizes
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence

SHAPES = ((64, 16), (64, 64), (64, 256), (64, 512), (64, 1024), (64, 1984), (64, 2048), (64, 4096), (1, 8191))
SMALL_SHAPES = ((4, 12), (4, 60), (1, 120))
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 1, "vocab_size": 2048, "max_position_embeddings": 1024}
SLEEP_CYCLES = 200_000_000  # about 0.1 s of device sleep: longer than any step's host time
OWN_BUCKET = 16  # a shape past the default buckets gets one of its token count rounded up to this


@dataclass(frozen=True)
class Timing:
    host_ms: float
    gpu_ms: float | None  # None off CUDA
    step_ms: float


@dataclass(frozen=True)
class ShapeResult:
    decodes: int
    prefill: int
    tokens: int
    bucket: int
    own_bucket: bool  # past the default list: a bucket of its own
    eager: Timing
    graphs: Timing
    max_abs_diff: float  # graph path logits against eager, over the sampled rows
    argmax_agree: float  # fraction of sampled rows whose greedy token is the same


def build_engine(small: bool) -> Engine:
    folder = model_folder({**QWEN25_7B, **(SMALL if small else {})})
    if small:
        cfg = EngineConfig(model=folder, load_format="dummy", device="cpu", dtype="float32", max_num_batched_tokens=512,
                           max_model_len=1024, num_kv_blocks=256, enable_prefix_caching=False)
    else:
        cfg = EngineConfig(model=folder, load_format="dummy", dtype="bfloat16", max_num_batched_tokens=8192,
                           max_model_len=8192, enable_prefix_caching=False)
    return Engine(cfg)


class Steps:
    """Synthetic mixed steps: sequences of random tokens whose earlier context counts as computed."""

    def __init__(self, engine: Engine, decode_context: int):
        self.engine, self.decode_context = engine, decode_context
        self.rng = random.Random(0)

    def make(self, decodes: int, prefill: int) -> SchedulerOutput:
        seqs = [self._seq(0, prefill)] + [self._seq(self.decode_context, 1) for _ in range(decodes)]
        return SchedulerOutput(seqs, [prefill] + [1] * decodes)

    def free(self, sched: SchedulerOutput) -> None:
        for seq in sched.seqs:
            self.engine.block_manager.free(seq)

    def _seq(self, context: int, new: int) -> Sequence:
        vocab = self.engine.model_config.vocab_size
        seq = Sequence(f"s{self.rng.getrandbits(40):x}", [self.rng.randrange(vocab) for _ in range(context + new)],
                       SamplingParams(max_tokens=1))
        self.engine.block_manager.allocate(seq, context + new)
        seq.num_computed_tokens = context
        return seq


@contextmanager
def device_held(runner, mixed: bool, marks: list):
    """Make the device sleep right before the step's first model kernel (after the inputs' copies, which
    wait for the stream), then record a start event: the host enqueues the whole step while it sleeps."""
    target, name = (runner.mixed_graphs, "_replay") if mixed else (runner, "_forward")
    original = getattr(target, name)

    def held(*args):
        if not marks:
            torch.cuda._sleep(SLEEP_CYCLES)
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[0].record()
        return original(*args)
    setattr(target, name, held)
    try:
        yield
    finally:
        delattr(target, name)


def time_path(runner, sched: SchedulerOutput, mixed: bool, reps: int) -> Timing:
    host, step, gpu = [], [], []
    for _ in range(reps + 1):  # the first run may compile a kernel variant
        sync()
        t0 = time.perf_counter()
        launched = runner.launch(sched)
        t1 = time.perf_counter()
        runner.collect(launched)
        host.append((t1 - t0) * 1e3)
        step.append((time.perf_counter() - t0) * 1e3)
        if runner.device.type == "cuda":  # the engine's device, not whether the machine has a GPU
            gpu.append(_gpu_ms(runner, sched, mixed))
    return Timing(statistics.median(host[1:]), statistics.median(gpu[1:]) if gpu else None,
                  statistics.median(step[1:]))


def _gpu_ms(runner, sched: SchedulerOutput, mixed: bool) -> float:
    marks: list = []
    sync()
    with device_held(runner, mixed, marks):
        launched = runner.launch(sched)
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    runner.collect(launched)
    end.synchronize()
    return marks[0].elapsed_time(end)


@torch.inference_mode()
def sampled_logits(runner, sched: SchedulerOutput, mixed: bool) -> torch.Tensor:
    hidden, rows = runner._run_mixed(sched) if mixed else runner._run_eager(sched)
    return runner.model.compute_logits(hidden[rows]).float()


def measure_shape(engine: Engine, steps: Steps, decodes: int, prefill: int, default: list[int], reps: int,
                  on_cuda: bool) -> ShapeResult:
    runner, tokens = engine.runner, decodes + prefill
    own = tokens > default[-1]
    bucket = -(-tokens // OWN_BUCKET) * OWN_BUCKET if own else min(s for s in default if s >= tokens)
    runner.mixed_graphs = None
    if on_cuda:
        torch.cuda.empty_cache()
    graphs = runner.build_mixed_graphs(use_graphs=on_cuda, sizes=[bucket])
    sched = steps.make(decodes, prefill)
    try:
        eager = time_path(runner, sched, mixed=False, reps=reps)
        want = sampled_logits(runner, sched, mixed=False)
        runner.mixed_graphs = graphs
        timed = time_path(runner, sched, mixed=True, reps=reps)
        got = sampled_logits(runner, sched, mixed=True)
    finally:
        steps.free(sched)
        runner.mixed_graphs = None
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    return ShapeResult(decodes, prefill, tokens, bucket, own, eager, timed, (got - want).abs().max().item(), agree)


def capture_seconds(engine: Engine, sizes: list[int]) -> float:
    """Seconds to capture the default bucket list, as the engine does at start."""
    runner = engine.runner
    runner.mixed_graphs = None
    sync()
    t0 = time.perf_counter()
    runner.mixed_graphs = runner.build_mixed_graphs(use_graphs=runner.device.type == "cuda", sizes=sizes)
    sync()
    seconds = time.perf_counter() - t0
    runner.mixed_graphs = None
    return seconds


def table(results: list[ShapeResult], capture_s: float, sizes: list[int], segments: int, start_s: float = 0.0) -> str:
    def ms(x):
        return f"{x:6.2f}" if x is not None else "     -"
    lines = [f"mixed step, eager vs piecewise graphs (ms); engine start {start_s:.1f} s, capture of {len(sizes)} "
             f"buckets x {segments} segments: {capture_s:.2f} s",
             "shape (decodes + prefill) | bucket | eager host  gpu   step | graphs host  gpu   step | step x | "
             "max|dlogit| argmax"]
    for r in results:
        speed = r.eager.step_ms / r.graphs.step_ms
        lines.append(f"{r.decodes:>4} + {r.prefill:<5}              | {r.bucket:>5}{'+' if r.own_bucket else ' '}| "
                     f"{ms(r.eager.host_ms)} {ms(r.eager.gpu_ms)} {ms(r.eager.step_ms)} | "
                     f"{ms(r.graphs.host_ms)} {ms(r.graphs.gpu_ms)} {ms(r.graphs.step_ms)} | {speed:5.2f}  | "
                     f"{r.max_abs_diff:9.3g}  {r.argmax_agree:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="a tiny model on the CPU (a dry run)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=170.0, help="shapes that would start past it are left out")
    args = parser.parse_args()
    deadline = Deadline(args.budget_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    engine = build_engine(args.small)
    start_s = time.perf_counter() - t0
    on_cuda = engine.runner.device.type == "cuda"
    default = [32, 64, 128] if args.small else mixed_sizes(engine.config.max_num_batched_tokens)
    capture_s = capture_seconds(engine, default)
    steps = Steps(engine, decode_context=32 if args.small else 1024)
    report = {"env": env_info(head_commit()), "engine_start_s": start_s, "capture_s": capture_s,
              "buckets": default, "segments": engine.runner.model.model.num_segments, "shapes": []}
    results = []
    for d, p in SMALL_SHAPES if args.small else SHAPES:
        if not deadline.allows(15):
            print(f"left out {d} + {p}: the time budget is spent")
            continue
        results.append(measure_shape(engine, steps, d, p, default, args.reps, on_cuda))
        report["shapes"].append(asdict(results[-1]))
        (out / "mixed_step.json").write_text(json.dumps(report, indent=2))  # after every shape
    print(table(results, capture_s, default, report["segments"], start_s))


if __name__ == "__main__":
    main()
