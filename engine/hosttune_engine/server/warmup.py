"""Warmup: real generations through every compiled path before /health says 200.

Triton compiles a kernel variant the first time it meets a new shape class,
and that first request pays about a second for it. So warmup runs, in order:

1. prefills alone in their steps, one per length class (under 1K, 1K-3K, 3K and
   more, a length that is a multiple of 16 and one that is not, and one longer
   than a step's token budget, which is chunked): the attention path without a
   prefix;
2. with prefix caching, the same prompts plus a few tokens: prefix-cache hits, the
   paged path (without it they would only repeat the prefills, at up to a second
   each for the longest context);
3. on CUDA, a prompt cut into 124-token chunks beside four decodes (the token
   budget lowered for it), its last chunk 64 tokens: the steps a time budget makes
   under traffic, each chunk attending to a longer cached prefix, which splits the
   keys (split-K) more ways as it grows, with a token count that is and one that
   is not a multiple of 16; without it the first such step under traffic waited
   for those kernels (2.9 s on a fresh H200);
4. staggered arrivals, so steps mix prefills with decodes (up to 64 at a time:
   past 33 decodes of a model with 4 KV heads on a 132-SM GPU a step's decode
   attention takes its one-split form, and the mixed steps' graphs were all
   captured at start);
5. a ramp of decodes, requests stopping one after another so that each batch size
   that has kernels of its own decodes once: every captured decode graph's size
   (its kernels were built when it was captured; a first replay still pays for
   itself) and every size past the largest, or, without graphs, every size up to
   the warmup batch; two of them decode at the longest context; the sampling
   paths rotate (greedy, temperature with top-p, top-k with a seed, logprobs).

An H200 run of the first version (only a long prefill and the ramp) showed
1.1-1.4 s first-request TTFTs for shape classes it had missed; this one covers them.
Whatever it still misses shows up as `hosttune:kernel_compiles_total` in /metrics
and a warning naming the kernel (core/kernel_compiles.py).

On CPU the engine runs the torch references, which compile nothing: the warmup only
proves that the model generates, through each step kind once (a prefill, a prefix hit,
mixed steps, a decode ramp of a few sequences), all on short prompts. A long-context
pass there would cost minutes (an 8K prefill of a 135M model takes most of one on two
cores) and warm nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.server.engine_client import EngineClient, RequestFailed

MAX_CUDA_BATCH = 512
MAX_CPU_BATCH = 4  # the CPU path compiles nothing; a short warmup proves it generates
MAX_MIXED = 64  # staggered requests beside each other (CUDA)
PREFILL_LENGTHS = (37, 512, 1500, 2048, 4001, 4096)
PREFIX_EXTRA = 7
CPU_MAX_PROMPT = 64  # tokens: the longest warmup prompt on CPU
CHUNK_TOKENS = 128  # the chunked group's token budget: one query tile a chunk, the most key splits
CHUNKED_PROMPT = 8192 + 2 * CHUNK_TOKENS  # long enough for every split count of a one-tile chunk
CHUNKED_DECODES = 4  # so the chunks before the last have 124 tokens
LAST_CHUNK = 64  # a multiple of 16, which the 124-token chunks are not: Triton builds a variant for each


@dataclass(frozen=True)
class WarmupGroup:
    """Requests submitted `stagger_s` apart; the next group starts when all of these finish."""

    name: str
    requests: tuple[EngineRequest, ...]
    stagger_s: float = 0.0
    max_step_tokens: int | None = None  # the engine's token budget while the group runs (None: as configured)


def _sampling(i: int, max_tokens: int) -> SamplingParams:
    kinds = (dict(temperature=0.0), dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, top_k=20, seed=i),
             dict(temperature=0.0, logprobs=5))
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kinds[i % len(kinds)])


def warmup_plan(max_batch: int, max_model_len: int, max_num_batched_tokens: int, kv_tokens: int,
                vocab_size: int, on_cuda: bool, prefix_caching: bool = True,
                graph_sizes: list[int] | None = None) -> list[WarmupGroup]:
    """The groups to run, in order. `graph_sizes`: the batch sizes of the captured decode graphs (None: no
    graphs, so the ramp decodes at every batch size)."""
    rng = random.Random(0)

    room = min(max_model_len, kv_tokens) - 2  # prompt + generated tokens must fit both
    if not on_cuda:
        room = min(room, CPU_MAX_PROMPT + 48)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(max(1, min(n, room - 2)))]

    lengths = sorted({n for n in (*PREFILL_LENGTHS, max_num_batched_tokens + 16) if n <= room - PREFIX_EXTRA - 2}
                     | {max(1, room - PREFIX_EXTRA - 2)})
    if not on_cuda:
        lengths = lengths[:1]
    prompts = {n: tokens(n) for n in lengths}
    groups = [WarmupGroup(f"prefill-{n}", (EngineRequest(f"warmup-prefill-{n}", ids, _sampling(0, 2)),))
              for n, ids in prompts.items()]
    if prefix_caching:
        groups += [WarmupGroup(f"prefix-hit-{n}", (EngineRequest(f"warmup-prefix-{n}", ids + tokens(PREFIX_EXTRA),
                                                                 _sampling(3, 2)),)) for n, ids in prompts.items()]
    if on_cuda:
        groups.append(_chunked(room, tokens))
    batch = min(max_batch, MAX_CUDA_BATCH if on_cuda else MAX_CPU_BATCH)
    longest_mixed, most_tokens = (300, 33) if on_cuda else (CPU_MAX_PROMPT // 2, 5)
    mixed = []
    for i in range(min(batch, MAX_MIXED)):
        ids = tokens(rng.randrange(8, max(9, min(longest_mixed, room - 40))))
        max_tokens = max(1, min(rng.randrange(min(8, most_tokens - 1), most_tokens), room - len(ids)))
        mixed.append(EngineRequest(f"warmup-mixed-{i}", ids, _sampling(i, max_tokens)))
    groups.append(WarmupGroup("mixed", tuple(mixed), stagger_s=0.004 if on_cuda else 0.0))
    groups.append(WarmupGroup("decode-ramp", _ramp(_ramp_sizes(batch, graph_sizes if on_cuda else None), room,
                                                   prompts[lengths[-1]], tokens)))
    return groups


def _chunked(room: int, tokens) -> WarmupGroup:
    """A few short requests, then a long prompt that the lowered token budget cuts into chunks beside their
    decodes, which last until its end; its last chunk, over the longest prefix, is LAST_CHUNK tokens."""
    chunk = CHUNK_TOKENS - CHUNKED_DECODES
    prompt = tokens((min(CHUNKED_PROMPT, room - 2) - LAST_CHUNK) // chunk * chunk + LAST_CHUNK)
    steps = -(-len(prompt) // chunk) + 2
    decodes = [EngineRequest(f"warmup-chunked-decode-{i}", tokens(8 + i), _sampling(i, max(1, min(steps, room - 16))))
               for i in range(CHUNKED_DECODES)]
    return WarmupGroup("chunked", (*decodes, EngineRequest("warmup-chunked", prompt, _sampling(0, 2))),
                       stagger_s=0.01, max_step_tokens=CHUNK_TOKENS)


def _ramp_sizes(batch: int, graph_sizes: list[int] | None) -> list[int]:
    """The batch sizes the ramp decodes at: each captured graph's and every one past the largest, or all."""
    if not graph_sizes:
        return list(range(1, batch + 1))
    return sorted({s for s in graph_sizes if s < batch} | set(range(max(graph_sizes) + 1, batch + 1)) | {batch})


def _ramp(sizes: list[int], room: int, longest: list[int], tokens) -> tuple[EngineRequest, ...]:
    """One request per sequence of the largest batch; decode step t runs the ones with more than t tokens to
    make, so a request that the sizes put in r steps asks for r + 1 (the first token comes from its prefill).
    The two at the longest context stop first."""
    batch = max(sizes)
    steps = sorted(1 + sum(s > i for s in sizes) for i in range(batch))
    requests = []
    for i, n in enumerate(steps):
        ids = (longest + tokens(2))[:max(1, room - 2)] if i < 2 else tokens(8 + 8 * (i % 8))
        max_tokens = max(1, min(n, room - len(ids)))
        requests.append(EngineRequest(f"warmup-ramp-{i}", ids, _sampling(i, max_tokens)))
    return tuple(requests)


async def warm_up(client: EngineClient, groups: list[WarmupGroup],
                  limit_tokens: Callable[[int | None], None] | None = None) -> dict[str, float]:
    """Run each group to the end through the engine loop, in order; returns the seconds each took.
    `limit_tokens` sets the engine's token budget on its idle thread (`Engine.limit_batched_tokens`); a group
    that asks for a budget of its own is skipped without it."""
    seconds = {}
    for group in groups:
        if group.max_step_tokens is not None:
            if limit_tokens is None:
                continue
            await client.when_idle(partial(limit_tokens, group.max_step_tokens))
        try:
            seconds[group.name] = await _run_group(client, group)
        finally:
            if group.max_step_tokens is not None:
                await client.when_idle(partial(limit_tokens, None))
    return seconds


async def _run_group(client: EngineClient, group: WarmupGroup) -> float:
    t0 = time.monotonic()
    queue: asyncio.Queue = asyncio.Queue()
    for request in group.requests:
        client.submit(request, queue)
        if group.stagger_s:
            await asyncio.sleep(group.stagger_s)
    unfinished = {r.request_id for r in group.requests}
    while unfinished:
        item = await queue.get()
        if isinstance(item, RequestFailed):
            raise RuntimeError(f"warmup request {item.request_id} ({group.name}) failed: {item.error}")
        if item.finished:
            unfinished.discard(item.request_id)
    return time.monotonic() - t0
