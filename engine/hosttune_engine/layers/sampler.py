"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, logprobs.

Random rows sample by the exponential race (argmax of probs / Exp(1) noise),
which needs no CPU sync; a seeded request draws its noise from its own
generator, so its tokens do not depend on what else is in the batch. Top-k and
top-p run the race by rejection (`kernels.race`), without sorting the
vocabulary; `filter_top_k_top_p`, the sort it replaced, stays as its reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.kernels.race import race_sample, race_sample_ref
from hosttune_engine.sampling import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors, built once per step."""

    temperatures: torch.Tensor | None  # [N] fp32, 1.0 for greedy rows (None: all rows greedy)
    top_k: torch.Tensor | None  # [N] int64, vocab size where disabled
    top_p: torch.Tensor | None  # [N] fp32
    greedy: torch.Tensor | None  # [N] bool
    generators: list[torch.Generator | None]
    all_greedy: bool
    num_logprobs: int | None  # the most alternatives any row asked for; None: no logprobs

    @classmethod
    def build(cls, params: list[SamplingParams], generators, vocab_size: int, device) -> "SamplingBatch":
        """All-greedy batches (the common decode case) skip the per-row tensors: no host-to-device copies.
        The others go through pinned memory, so the copy does not wait for the device's earlier work."""
        greedy = [p.is_greedy for p in params]
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        all_greedy = all(greedy)
        tensor = (lambda values, dtype: None) if all_greedy else (
            lambda values, dtype: _to_device(torch.tensor(values, dtype=dtype), device))
        return cls(
            temperatures=tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32),
            top_k=tensor([p.top_k or vocab_size for p in params], torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            greedy=tensor(greedy, torch.bool),
            generators=list(generators),
            all_greedy=all_greedy,
            num_logprobs=max(wanted) if wanted else None,
        )


def _to_device(values: torch.Tensor, device) -> torch.Tensor:
    if torch.device(device).type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)  # the pinned block is kept until the copy ran


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float] | None = None  # of each chosen token
    top_ids: list[list[int]] | None = None  # [N][num_logprobs]
    top_logprobs: list[list[float]] | None = None


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf. logits [N, V]. The sampler's reference
    (tests, benchmarks): it sorts every row, which the race by rejection avoids."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # the first token is always kept
        cut = (mass_before > top_p[:, None]) & (top_p[:, None] < 1.0)  # 1.0: keep all, whatever the rounding
        sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


@dataclass
class DeviceSample:
    """A step's sampled tokens (and logprobs) on the device, with their copies to the host enqueued right
    behind the sampling (`Sampler.sample` starts them). `to_host` waits for those copies alone. A copy made
    at read time would queue behind everything the stream got since: the engine reads a step's tokens after
    it launched the next step, so it would wait for that step too, and the device would idle meanwhile."""

    tokens: torch.Tensor  # [N]
    logprobs: torch.Tensor | None = None  # [N] of each chosen token
    top: tuple[torch.Tensor, torch.Tensor] | None = None  # ids and logprobs [N, num_logprobs]
    _host: list[torch.Tensor | None] | None = None  # tokens, logprobs, top ids, top logprobs on the host
    _copied: torch.cuda.Event | None = None

    def start_copy(self) -> None:
        top = self.top or (None, None)
        self._host = [t if t is None else t.to("cpu", non_blocking=True, copy=True)  # pinned, from CUDA
                      for t in (self.tokens, self.logprobs, *top)]
        if self.tokens.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def to_host(self) -> SamplerOutput:
        if self._host is None:
            self.start_copy()
        if self._copied is not None:
            self._copied.synchronize()
        tokens, logprobs, top_ids, top_logprobs = (t if t is None else t.tolist() for t in self._host)
        out = SamplerOutput(token_ids=tokens, logprobs=logprobs)
        if top_ids is not None:
            out.top_ids, out.top_logprobs = top_ids, top_logprobs
        return out


class Sampler:
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """logits [N, V] fp32 -> one token per row, on the host."""
        return self.sample(logits, batch).to_host()

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> DeviceSample:
        """logits [N, V] fp32 -> one token per row, left on the device, its copy to the host enqueued (no sync)."""
        tokens = logits.argmax(dim=-1)
        if not batch.all_greedy:
            tokens = torch.where(batch.greedy, tokens, self._sample(logits, batch))
        out = DeviceSample(tokens)
        if batch.num_logprobs is not None:
            logprobs = logits.log_softmax(dim=-1)
            out.logprobs = logprobs.gather(-1, tokens[:, None])[:, 0]
            if batch.num_logprobs:
                top = logprobs.topk(batch.num_logprobs, dim=-1)
                out.top = (top.indices, top.values)
        out.start_copy()
        return out

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        noise = torch.empty_like(logits, dtype=torch.float32).exponential_()
        for i, gen in enumerate(batch.generators):
            if gen is not None:
                noise[i].exponential_(generator=gen)
        race = race_sample if logits.is_cuda else race_sample_ref
        return race(logits, noise, batch.temperatures, batch.top_k, batch.top_p)
