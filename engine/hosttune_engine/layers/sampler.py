"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, logprobs.

Random rows sample by the exponential race (argmax of probs / Exp(1) noise),
which needs no CPU sync; a seeded request draws its noise from its own
generator, so its tokens do not depend on what else is in the batch. Top-k and
top-p run the race by rejection (`kernels.race`), without sorting the
vocabulary. A small batch with a row that sets both sorts instead
(`sort_sample`, also the race's reference): there, the race's one
program per row selecting the k-th prob is slower than a sort over the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from hosttune_engine.host_copy import HostCopy
from hosttune_engine.kernels.race import MIN_TEMPERATURE, race_sample, race_sample_ref
from hosttune_engine.layers.logit_adjustments import LogitAdjustments, TokenHistory, adjust_logits, to_device
from hosttune_engine.sampling import SamplingParams

# Below this many rows, a batch with a row that sets both top-k and top-p sorts. H200, vocab 152K (ms,
# race vs sort): 1.13 vs 0.27 at 1 row, 1.15 vs 1.64 at 64, 2.19 vs 5.21 at 256 (benchmarks/history/NOTES.md).
SORT_TOP_K_AND_P_BELOW = 64


MT_WORDS = 624  # mt19937's state
MT_STATE_AT = 24  # byte offset of its words in a CPU generator's state (after seed, left, seeded, next)


def seeded_generator(seed: int, device) -> torch.Generator:
    """A request's generator: each seed of vLLM's range (64-bit, signed) its own stream. CUDA's Philox takes all
    64 bits; the CPU's mt19937 seeds from the low 32 alone, so a seed past them (or negative) fills the state
    from both halves (init_by_array, as Python's random seeds a big int), and a 32-bit seed keeps its stream."""
    gen = torch.Generator(device)
    bits = seed % 2**64
    if gen.device.type != "cpu" or bits < 2**32:
        return gen.manual_seed(bits)
    state = gen.manual_seed(bits).get_state()  # its header: this seed, the state to be twisted before a draw
    words = np.random.RandomState([bits & 0xFFFFFFFF, bits >> 32]).get_state()[1]
    state.numpy()[MT_STATE_AT:MT_STATE_AT + 8 * MT_WORDS].view(np.uint64)[:] = words
    gen.set_state(state)
    return gen


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors, built once per step."""

    temperatures: torch.Tensor | None  # [N] fp32, 1.0 for greedy rows (None: all rows greedy)
    top_k: torch.Tensor | None  # [N] int64, vocab size where disabled
    top_p: torch.Tensor | None  # [N] fp32
    greedy: torch.Tensor | None  # [N] bool
    generators: list[torch.Generator | None]
    all_greedy: bool
    top_k_and_p: bool  # a sampled row sets both top-k and top-p
    num_logprobs: int | None  # the most alternatives any row asked for; None: no logprobs
    adjustments: LogitAdjustments | None = None  # penalties, min_p, min_tokens, logit_bias; None: no row sets one

    @classmethod
    def build(cls, params: list[SamplingParams], generators, vocab_size: int, device,
              histories: list[TokenHistory | None] | None = None, stop_ids: tuple[int, ...] = ()) -> "SamplingBatch":
        """All-greedy batches (the common decode case) skip the per-row tensors: no host-to-device copies.
        The others go through pinned memory, so the copy does not wait for the device's earlier work.
        `histories` (per row; None where a row counts no tokens) and `stop_ids` (the model's EOS ids) are what
        penalties and min_tokens read."""
        greedy = [p.is_greedy for p in params]
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        all_greedy = all(greedy)
        tensor = (lambda values, dtype: None) if all_greedy else (
            lambda values, dtype: to_device(torch.tensor(values, dtype=dtype), device))
        return cls(
            temperatures=tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32),
            top_k=tensor([p.top_k or vocab_size for p in params], torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            greedy=tensor(greedy, torch.bool),
            generators=list(generators),
            all_greedy=all_greedy,
            top_k_and_p=any(0 < p.top_k < vocab_size and p.top_p < 1 and not g for p, g in zip(params, greedy)),
            num_logprobs=max(wanted) if wanted else None,
            adjustments=LogitAdjustments.build(params, histories or [None] * len(params), stop_ids, vocab_size,
                                               device),
        )


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float] | None = None  # of each chosen token
    top_ids: list[list[int]] | None = None  # [N][num_logprobs]
    top_logprobs: list[list[float]] | None = None


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf. logits [N, V]. It sorts every row
    (`sort_sample`)."""
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


def sort_sample(logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor) -> torch.Tensor:
    """`race_sample`'s tokens the sorting way: mask each sorted row to its top-k and top-p, then race over
    what is left. The sampler's path for small batches that set both, and the race's reference."""
    scaled = logits / temperature.clamp(min=MIN_TEMPERATURE)[:, None]
    return (filter_top_k_top_p(scaled, top_k, top_p).softmax(dim=-1) / noise).argmax(dim=-1)


@dataclass
class DeviceSample:
    """A step's sampled tokens (and logprobs) on the device, with their copies to the host enqueued right
    behind the sampling, when it is made (`HostCopy`); `to_host` waits for those copies alone."""

    tokens: torch.Tensor  # [N]
    logprobs: torch.Tensor | None = None  # [N] of each chosen token
    top: tuple[torch.Tensor, torch.Tensor] | None = None  # ids and logprobs [N, num_logprobs]
    _copy: HostCopy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._copy = HostCopy([self.tokens, self.logprobs, *(self.top or (None, None))])

    def to_host(self) -> SamplerOutput:
        tokens, logprobs, top_ids, top_logprobs = self._copy.lists()
        out = SamplerOutput(token_ids=tokens, logprobs=logprobs)
        if top_ids is not None:
            out.top_ids, out.top_logprobs = top_ids, top_logprobs
        return out


class Sampler:
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """logits [N, V] fp32 -> one token per row, on the host."""
        return self.sample(logits, batch).to_host()

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> DeviceSample:
        """logits [N, V] fp32 -> one token per row, left on the device, its copy to the host enqueued (no sync).
        Tokens are drawn from the adjusted logits (`batch.adjustments`); logprobs are the model's own."""
        scores = logits if batch.adjustments is None else adjust_logits(logits, batch.adjustments)
        tokens = scores.argmax(dim=-1)
        if not batch.all_greedy:
            tokens = torch.where(batch.greedy, tokens, self._sample(scores, batch))
        if batch.num_logprobs is None:
            return DeviceSample(tokens)
        logprobs = logits.log_softmax(dim=-1)
        top = logprobs.topk(batch.num_logprobs, dim=-1) if batch.num_logprobs else None
        return DeviceSample(tokens, logprobs.gather(-1, tokens[:, None])[:, 0],
                            (top.indices, top.values) if top is not None else None)

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        noise = torch.empty_like(logits, dtype=torch.float32).exponential_()
        for i, gen in enumerate(batch.generators):
            if gen is not None:
                noise[i].exponential_(generator=gen)
        if batch.top_k_and_p and logits.shape[0] < SORT_TOP_K_AND_P_BELOW:
            sample = sort_sample
        else:
            sample = race_sample if logits.is_cuda else race_sample_ref
        return sample(logits, noise, batch.temperatures, batch.top_k, batch.top_p)
