"""What a request's settings do to its logits before the sampler: logit_bias, min_tokens, the repetition,
frequency and presence penalties, and min_p, with vLLM's semantics and in vLLM's order.

Torch ops over the rows that ask for one, written into a copy of the step's logits; a batch where no row asks
builds none (`LogitAdjustments.build` returns None) and the sampler runs as it would without this module. The
sampler's argmax (greedy rows) and its race read the adjusted logits; logprobs stay the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from hosttune_engine.sampling import SamplingParams

MIN_P_TEMPERATURE = 1e-5  # a greedy row keeps its most probable token whatever min_p says: no division by 0


@dataclass(frozen=True)
class TokenHistory:
    """What a row's penalties and min_tokens read of its sequence."""

    prompt_ids: tuple[int, ...]  # each id once
    output_counts: Mapping[int, int]
    num_output_tokens: int


@dataclass
class LogitAdjustments:
    """One step's adjustments, over `rows` of its logits (the rows that set something)."""

    rows: torch.Tensor  # [R] int64
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # row (of R), token id, bias: each [B]
    banned: tuple[torch.Tensor, torch.Tensor] | None  # row (of R), token id: [M] each, set to -inf
    repetition: torch.Tensor | None  # [R] fp32, 1 where off
    seen: torch.Tensor | None  # [R, V] bool: in the prompt or the output
    presence: torch.Tensor | None  # [R] fp32
    frequency: torch.Tensor | None  # [R] fp32
    counts: torch.Tensor | None  # [R, V] fp32: each output token's count
    min_p: torch.Tensor | None  # [R] fp32, 0 where off
    temperatures: torch.Tensor | None  # [R] fp32, what min_p's probabilities are taken at

    @classmethod
    def build(cls, params: list[SamplingParams], histories: list[TokenHistory | None], stop_ids: tuple[int, ...],
              vocab_size: int, device) -> "LogitAdjustments | None":
        """None where no row sets any. `stop_ids`: the model's EOS ids, which min_tokens holds back (with each
        row's stop_token_ids) unless the row ignores EOS. A row that counts tokens has its history."""
        picked = [i for i, p in enumerate(params) if p.adjusts_logits]
        if not picked:
            return None
        ps = [params[i] for i in picked]
        hs = [histories[i] for i in picked]
        tensor = lambda values, dtype: to_device(torch.tensor(values, dtype=dtype), device)  # noqa: E731
        seen, counts = _histories(ps, hs, vocab_size, device) if any(p.counts_tokens for p in ps) else (None, None)
        sampled_min_p = [p.min_p if not p.is_greedy else 0.0 for p in ps]  # min_p never changes an argmax
        return cls(
            rows=tensor(picked, torch.int64),
            bias=_bias(ps, vocab_size, tensor),
            banned=_banned(ps, hs, stop_ids, vocab_size, tensor),
            repetition=tensor([p.repetition_penalty for p in ps], torch.float32) if seen is not None else None,
            seen=seen,
            presence=tensor([p.presence_penalty for p in ps], torch.float32) if counts is not None else None,
            frequency=tensor([p.frequency_penalty for p in ps], torch.float32) if counts is not None else None,
            counts=counts,
            min_p=tensor(sampled_min_p, torch.float32) if any(sampled_min_p) else None,
            temperatures=tensor([max(p.temperature, MIN_P_TEMPERATURE) for p in ps], torch.float32)
            if any(sampled_min_p) else None,
        )


def _bias(ps: list[SamplingParams], vocab_size: int, tensor):
    entries = [(r, t, b) for r, p in enumerate(ps) for t, b in p.logit_bias if t < vocab_size]
    if not entries:
        return None
    rows, ids, values = zip(*entries)
    return tensor(rows, torch.int64), tensor(ids, torch.int64), tensor(values, torch.float32)


def _banned(ps: list[SamplingParams], hs: list[TokenHistory | None], stop_ids: tuple[int, ...], vocab_size: int,
            tensor):
    """min_tokens: the rows with fewer tokens out, and each one's EOS and stop token ids."""
    entries = []
    for r, (p, h) in enumerate(zip(ps, hs)):
        if p.min_tokens and (h.num_output_tokens if h is not None else 0) < p.min_tokens:
            ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(stop_ids))
            entries += [(r, t) for t in sorted(ids) if t < vocab_size]
    if not entries:
        return None
    rows, ids = zip(*entries)
    return tensor(rows, torch.int64), tensor(ids, torch.int64)


def _histories(ps: list[SamplingParams], hs: list[TokenHistory | None], vocab_size: int, device):
    """[R, V] of the tokens seen (prompt or output) and of each output token's count, made on the device from
    the ids alone (a dense [R, V] copied over would be tens of MB a step at a 150K vocabulary)."""
    prompt_rows, prompt_ids, out_rows, out_ids, out_counts = [], [], [], [], []
    for r, h in enumerate(hs):
        if h is None:
            continue
        prompt_rows += [r] * len(h.prompt_ids)
        prompt_ids += h.prompt_ids
        out_rows += [r] * len(h.output_counts)
        out_ids += h.output_counts.keys()
        out_counts += h.output_counts.values()
    host = torch.tensor(prompt_rows + prompt_ids + out_rows + out_ids, dtype=torch.int64)
    rows_ids = to_device(host, device).split([len(prompt_rows)] * 2 + [len(out_rows)] * 2)
    counts = torch.zeros(len(ps), vocab_size, dtype=torch.float32, device=device)
    counts.index_put_((rows_ids[2], rows_ids[3]), to_device(torch.tensor(out_counts, dtype=torch.float32), device))
    seen = counts > 0
    seen.index_put_((rows_ids[0], rows_ids[1]), torch.tensor(True, device=device))
    return seen, counts


def to_device(values: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device`; to a GPU through pinned memory, so the copy does not wait for the device's
    earlier work."""
    if torch.device(device).type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)  # the pinned block is kept until the copy ran


def adjust_logits(logits: torch.Tensor, adj: LogitAdjustments) -> torch.Tensor:
    """logits [N, V] fp32 -> a copy with each adjusted row's settings applied (vLLM's order: logit_bias and
    min_tokens, then the penalties, then min_p at the row's temperature)."""
    sub = logits.index_select(0, adj.rows)  # [R, V]
    if adj.bias is not None:
        rows, ids, values = adj.bias
        sub.index_put_((rows, ids), values, accumulate=True)
    if adj.banned is not None:
        sub.index_put_(adj.banned, torch.tensor(float("-inf"), device=sub.device))
    if adj.seen is not None:
        rep = adj.repetition[:, None]
        sub = torch.where(adj.seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    if adj.counts is not None:
        sub = sub - adj.frequency[:, None] * adj.counts - adj.presence[:, None] * (adj.counts > 0)
    if adj.min_p is not None:
        probs = (sub / adj.temperatures[:, None]).softmax(dim=-1)
        cut = probs < adj.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        sub = sub.masked_fill(cut, float("-inf"))
    return logits.index_copy(0, adj.rows, sub)
