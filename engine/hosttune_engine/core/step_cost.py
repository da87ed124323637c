"""What a step costs, measured at start, so that a step with running decodes admits only as
many prefill tokens as fit a time budget (torch-free: the model runs through a runner).

The model of one step's seconds:

    step_seconds = T(num_tokens) + decode_s * decode_context + prefill_s * prefill_pairs

- `T(n)`: a step of n tokens at short context, interpolated between measured points
  (the weights' GEMMs, the launches, the sampler; linear past the last point).
- `decode_context`: the context tokens that the step's decodes read (KV-cache reads).
- `prefill_pairs`: (query, key) pairs of prefill chunks over their earlier context
  (chunk tokens x context before the chunk), the attention work chunking adds.

Measured on the path mixed steps take (one decode beside a prefill chunk: piecewise graphs
up to their largest bucket on CUDA, eager past it): T at a grid of token counts, then the
two attention terms at a long context; and a decode-only step (on CUDA graphs where the
runner has them), the step whose time inter-token latency is when no prompt waits. Each
point is the fastest of a few runs, the first of which may compile kernels or meet a one-off
cost (a server measures after its warmup, and still takes the fastest of them).

The automatic budget (`--max-step-ms auto`) is one figure per server: `AUTO_DECODE_STEPS` times a
full decode-only step measured at start (the decode-only batch at the long context of the decode
term); without that measurement, that many times the model's decode-only step of the step's own
decodes. Never so small that a chunk of `USEFUL_CHUNK` tokens cannot fit. It does not follow the
load: a budget that shrank with the decode-only steps seen (few and fast while prompts queue) once
shrank itself to 13 ms and halved a server's output rate.
"""

from __future__ import annotations

import bisect
import random
import time
from dataclasses import dataclass

from hosttune_engine.core.scheduler_output import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.sampling import SamplingParams

CUDA_TOKEN_POINTS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384)
CPU_TOKEN_POINTS = (16, 64)  # a CPU step is linear in tokens past a few dozen
CUDA_RUNS, CPU_RUNS = 2, 1  # the first CUDA run may compile; CPU references compile nothing
# The automatic budget: this many full decode-only steps. On an H200 (7B shape) 64 decodes at 4,096 tokens of
# context take 9-11 ms alone. With 64 streaming users and every step launched ahead of the one before, most
# steps are decode-only once prompts stop queueing, and those (10 ms) are the inter-token median: 2.7 of them
# (28.8 ms) put p99 at 3.2x p50, 2.4 (24-26 ms) at 1.6-2.8x, with TTFT p95 0.76-0.77 s past the users'
# start-up burst (benchmarks/history/BENCHMARKS-2026-12-03.md).
AUTO_DECODE_STEPS = 2.4
USEFUL_CHUNK = 256  # prompt tokens the automatic budget always leaves room for
LONG_CONTEXT = 4096  # tokens, at most, for the attention terms
DECODE_BATCH = {True: 32, False: 8}  # decodes beside a short chunk, for the decode term (CUDA, CPU)
PAIR_CHUNK = {True: 256, False: 32}  # chunk tokens for the prefill-pair term


@dataclass(frozen=True)
class StepCostModel:
    """Seconds per step shape (see the module docstring)."""

    token_points: tuple[int, ...]  # ascending
    token_seconds: tuple[float, ...]
    decode_s: float  # per context token read by a decode
    prefill_s: float  # per (query, earlier key) pair of a prefill chunk
    decode_step_s: float = 0.0  # a decode-only step at short context (0: not measured)
    full_decode_s: float = 0.0  # the same decodes at the long context of the decode term (0: not measured)

    def tokens_seconds(self, num_tokens: int) -> float:
        points, seconds = self.token_points, self.token_seconds
        if len(points) == 1:
            return seconds[0] * num_tokens / points[0]
        i = min(max(bisect.bisect_left(points, num_tokens), 1), len(points) - 1)
        n0, n1, t0, t1 = points[i - 1], points[i], seconds[i - 1], seconds[i]
        if num_tokens <= n0:
            return t0
        return t0 + (t1 - t0) * (num_tokens - n0) / (n1 - n0)

    def step_seconds(self, num_tokens: int, decode_context: int, prefill_pairs: int) -> float:
        return self.tokens_seconds(num_tokens) + self.decode_s * decode_context + self.prefill_s * prefill_pairs

    def auto_budget_s(self, num_decodes: int, decode_context: int) -> float:
        """The automatic budget of a step holding these decodes (see the module docstring)."""
        plain = self.full_decode_s or (
            (self.decode_step_s or self.tokens_seconds(num_decodes)) + self.decode_s * decode_context)
        return max(AUTO_DECODE_STEPS * plain, self.step_seconds(num_decodes + USEFUL_CHUNK, decode_context, 0))

    def max_chunk(self, budget_s: float, num_tokens: int, decode_context: int, prefill_pairs: int,
                  context: int, limit: int) -> int:
        """The most tokens (up to `limit`) of a prefill at `context` that a step already holding
        `num_tokens`, `decode_context` and `prefill_pairs` can add within `budget_s`."""
        def fits(n: int) -> bool:
            return self.step_seconds(num_tokens + n, decode_context, prefill_pairs + n * context) <= budget_s
        if limit <= 0 or not fits(1):
            return 0
        low, high = 1, limit  # fits(low); find the largest n that fits
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        return low


class StepProbe:
    """Runs synthetic steps through a runner: sequences of random tokens whose earlier
    context is taken as computed (its cache holds garbage, which timing does not mind)."""

    def __init__(self, runner, block_manager, max_tokens: int, max_context: int) -> None:
        self.runner = runner
        self.block_manager = block_manager
        self.max_tokens = max_tokens
        self.max_context = max_context
        self.block_size = block_manager.block_size
        self.rng = random.Random(0x5eed)
        self.vocab = runner.model_config.vocab_size

    def seconds(self, chunk: int, chunk_context: int, num_decodes: int, decode_context: int,
                runs: int) -> float:
        """The fastest of `runs` steps of one `chunk`-token prefill at `chunk_context` and
        `num_decodes` decodes at `decode_context`."""
        best = float("inf")
        for _ in range(runs):
            seqs = [self._seq(chunk_context, chunk)] if chunk else []
            seqs += [self._seq(decode_context, 1) for _ in range(num_decodes)]
            sched = SchedulerOutput(seqs, [chunk] * bool(chunk) + [1] * num_decodes)
            try:
                start = time.perf_counter()
                self.runner.collect(self.runner.launch(sched))
                best = min(best, time.perf_counter() - start)
            finally:
                for seq in seqs:
                    self.block_manager.free(seq)
                    self.runner.release(seq.request_id)
        return best

    def _seq(self, context: int, num_new: int) -> Sequence:
        ids = self.rng.choices(range(self.vocab), k=context + num_new)  # a few times faster than randrange
        seq = Sequence(f"step-cost-{self.rng.getrandbits(48):x}", ids, SamplingParams(max_tokens=1))
        self.block_manager.allocate(seq, context + num_new)  # slots for everything
        seq.num_computed_tokens = context  # the earlier context counts as cached
        return seq


def measure_step_costs(probe: StepProbe, on_cuda: bool, kv_tokens: int, decode_batch: int,
                       runs: int | None = None) -> StepCostModel:
    """Fit the cost model from steps run through `probe` (see the module docstring); the
    decode-only step has `decode_batch` sequences. `runs` per step (default: CUDA_RUNS or CPU_RUNS)."""
    runs = runs or (CUDA_RUNS if on_cuda else CPU_RUNS)
    grid = CUDA_TOKEN_POINTS if on_cuda else CPU_TOKEN_POINTS
    largest = min(probe.max_tokens, probe.max_context)  # positions past the context would read past RoPE's table
    points = [n for n in grid if n < largest] + ([largest] if on_cuda else [])
    points = sorted({n for n in points if n + 16 + 64 <= kv_tokens})
    seconds = [probe.seconds(n - 1, 0, 1, 16, runs) for n in points]
    for i in range(len(seconds) - 2, -1, -1):  # more tokens never cost less: a slow outlier is lowered to
        seconds[i] = min(seconds[i], seconds[i + 1])  # the point after it, never spread over the points after
    decode_step = probe.seconds(0, 0, decode_batch, 16, runs) if decode_batch * 17 <= kv_tokens else 0.0
    model = StepCostModel(tuple(points), tuple(seconds), 0.0, 0.0, decode_step)
    batch = DECODE_BATCH[on_cuda]
    context = min(LONG_CONTEXT, probe.max_context // 2, kv_tokens // (batch + 4))
    bs = probe.block_size
    context = (context + 1) // bs * bs - 1  # each decode's context and token fill whole blocks: no rounding up
    if context < 64:
        return model
    decodes = probe.seconds(16, 0, batch, context, runs) - model.tokens_seconds(16 + batch)
    chunk = min(PAIR_CHUNK[on_cuda], probe.max_tokens - 1)
    pairs = probe.seconds(chunk, context, 1, 16, runs) - model.tokens_seconds(chunk + 1)
    full = probe.seconds(0, 0, decode_batch, context, runs) if decode_step and decode_batch * (context + 1) <= kv_tokens \
        else 0.0
    return StepCostModel(model.token_points, model.token_seconds, max(0.0, decodes / (batch * context)),
                         max(0.0, pairs / (chunk * context)), decode_step, full)
