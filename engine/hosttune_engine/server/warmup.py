"""Warmup: real generations through every compiled path before /health says 200.

Three things must have run once before the first user request, or that request
pays for compiling them: a prefill long enough to be chunked (when the
context allows one longer than a step's token budget), decode at every batch
size up to the warmup batch (request i stops after i + 1 tokens, so the batch
shrinks one by one: kernels specialised, or CUDA graphs captured, per batch
size all run), and each sampling path (greedy, temperature with top-p, top-k
with a seed, logprobs).
"""

from __future__ import annotations

import asyncio
import random
import time

from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.server.engine_client import EngineClient, RequestFailed

MAX_CUDA_BATCH = 512
MAX_CPU_BATCH = 4  # the CPU path compiles nothing; a short warmup proves it generates


def _sampling(i: int, max_tokens: int) -> SamplingParams:
    kinds = (dict(temperature=0.0), dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, top_k=20, seed=i),
             dict(temperature=0.0, logprobs=5))
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kinds[i % len(kinds)])


def warmup_requests(max_batch: int, max_model_len: int, max_num_batched_tokens: int, kv_tokens: int,
                    vocab_size: int, on_cuda: bool) -> list[EngineRequest]:
    rng = random.Random(0)
    batch = min(max_batch, MAX_CUDA_BATCH if on_cuda else MAX_CPU_BATCH)
    room = min(max_model_len, kv_tokens) - 2
    requests = []
    long_len = max(1, min(max_num_batched_tokens + 16, room - 1))
    requests.append(EngineRequest("warmup-long", [rng.randrange(vocab_size) for _ in range(long_len)],
                                  _sampling(0, 1)))
    for i in range(batch):
        prompt_len = max(1, min(8 + 8 * (i % 8), room - i - 1))
        ids = [rng.randrange(vocab_size) for _ in range(prompt_len)]
        requests.append(EngineRequest(f"warmup-{i}", ids, _sampling(i, max(1, min(i + 1, room - prompt_len)))))
    return requests


async def warm_up(client: EngineClient, requests: list[EngineRequest]) -> float:
    """Run the requests to the end through the engine loop; returns the seconds it took."""
    t0 = time.monotonic()
    queue: asyncio.Queue = asyncio.Queue()
    for request in requests:
        client.submit(request, queue)
    unfinished = {r.request_id for r in requests}
    while unfinished:
        item = await queue.get()
        if isinstance(item, RequestFailed):
            raise RuntimeError(f"warmup request {item.request_id} failed: {item.error}")
        if item.finished:
            unfinished.discard(item.request_id)
    return time.monotonic() - t0
