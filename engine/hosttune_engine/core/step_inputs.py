"""The inputs of one eagerly run step, packed for the attention layer.

Prefill chunks come first, then one token per decoding sequence. Token ids,
positions, cache slots, the rows to sample and the attention metadata are
packed with numpy into one int32 array that moves to the device in one copy.
(Decode-only steps on CUDA use the persistent buffers of `core.cuda_graphs`; mixed
steps on CUDA put ids, positions and slots in those of `core.mixed_graphs`, and the
rest through `pack_attention`.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.staging import Uploads, fed_ids
from hosttune_engine.kernels.decode_attention import choose_num_splits
from hosttune_engine.layers.attention import AttentionMetadata


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [N] row of each sampled sequence's last token
    sample_seqs: list[Sequence]


@dataclass
class StepPlan:
    """A step's inputs on the host: per token its id, position and cache slot (int64 [T]), per prefill
    chunk (query length, context incl. the chunk, block table), per decode (context, block table)."""

    ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    prefill: list[tuple[int, int, list[int]]]
    decode: list[tuple[int, list[int]]]
    sample_rows: list[int]
    sample_seqs: list[Sequence]
    feed: np.ndarray | None = None  # per token: the row of the previous step's tokens it takes (-1: its id)

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


def plan_step(sched: SchedulerOutput, block_size: int, feed: list[int] | None = None) -> StepPlan:
    """`feed`: per sequence, the row of the previous step's tokens (still on the device) that is its one new
    token, or -1 (see `ModelRunner.launch`)."""
    bs = block_size
    ids, pos, slots = [], [], []
    prefill, decode, sample_rows, sample_seqs = [], [], [], []
    fed = []  # (token row, source row)
    num_tokens = 0
    for i, (seq, n) in enumerate(zip(sched.seqs, sched.num_new_tokens)):
        if feed is not None and feed[i] >= 0:
            fed.append((num_tokens, feed[i]))
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        p = np.arange(start, end, dtype=np.int64)
        ids.append(np.asarray(seq.token_ids[start:end], dtype=np.int64))
        pos.append(p)
        table = np.asarray(seq.block_table[start // bs: -(-end // bs)], dtype=np.int64)
        slots.append(table[p // bs - start // bs] * bs + p % bs)
        (prefill.append((n, end, seq.block_table)) if n > 1 else decode.append((end, seq.block_table)))
        num_tokens += n
        if end == seq.num_tokens:
            sample_rows.append(num_tokens - 1)
            sample_seqs.append(seq)
    token_feed = None
    if fed:
        token_feed = np.full(num_tokens, -1, dtype=np.int64)
        rows, sources = zip(*fed)
        token_feed[list(rows)] = sources
    return StepPlan(np.concatenate(ids), np.concatenate(pos), np.concatenate(slots), prefill, decode, sample_rows,
                    sample_seqs, token_feed)


def feed_tokens(ids: torch.Tensor, feed: torch.Tensor, source: torch.Tensor) -> None:
    """Where `feed` >= 0, replace the token id in `ids` (in place) by row `feed` of `source`, the previous
    step's tokens on the device; enqueued, not waited for."""
    ids.copy_(fed_ids(ids, feed, source))


def pack_step(sched: SchedulerOutput, block_size: int, device: torch.device, num_kv_heads: int,
              num_sms: int, feed: list[int] | None = None, source: torch.Tensor | None = None) -> StepInputs:
    """Pack a step's inputs in numpy (int32), then move them to the device in one copy. With `feed` (see
    `plan_step`), the fed tokens' ids are then taken from `source` on the device."""
    plan = plan_step(sched, block_size, feed)
    host = HostPack()
    ids_at, pos_at, slots_at = (host.add(x) for x in (plan.ids, plan.positions, plan.slots))
    feed_at = host.add(plan.feed) if plan.feed is not None else None
    dev, meta, rows = pack_attention(plan, host, device, num_kv_heads, num_sms)
    meta.slot_mapping = dev[slots_at]
    if feed_at is not None:
        feed_tokens(dev[ids_at], dev[feed_at], source)
    return StepInputs(input_ids=dev[ids_at], positions=dev[pos_at], meta=meta, sample_rows=rows,
                      sample_seqs=plan.sample_seqs)


def pack_attention(plan: StepPlan, host: HostPack, device: torch.device, num_kv_heads: int, num_sms: int,
                   uploads: Uploads | None = None) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """Add the sampled rows and the attention metadata to `host` and move it all to the device in one copy
    (through `uploads`' pinned buffer when given, so without waiting for the device's earlier work): (the
    device copy, the metadata, whose `slot_mapping` the caller sets, the sampled rows [N])."""
    rows_at = host.add(np.asarray(plan.sample_rows))
    meta_at = _pack_metadata(host, plan.prefill, plan.decode)
    dev = host.to(device) if uploads is None else uploads.upload(host.flat())
    meta = _metadata(dev, meta_at, plan.prefill, plan.decode, None)
    if plan.decode:
        meta.decode_num_splits = choose_num_splits(len(plan.decode), num_kv_heads, max(c for c, _ in plan.decode),
                                                   num_sms)
    return dev, meta, dev[rows_at]


def _pack_metadata(host: HostPack, prefill, decode) -> dict:
    at = {}
    if prefill:
        at["cu"] = host.add(np.cumsum([0] + [q for q, _, _ in prefill]))
        at["p_lens"] = host.add(np.asarray([c for _, c, _ in prefill]))
        at["p_bt"] = host.add_table([t for _, _, t in prefill])
    if decode:
        at["d_lens"] = host.add(np.asarray([c for c, _ in decode]))
        at["d_bt"] = host.add_table([t for _, t in decode])
    return at


def _metadata(dev: torch.Tensor, at: dict, prefill, decode, slot_mapping) -> AttentionMetadata:
    meta = AttentionMetadata(slot_mapping=slot_mapping, num_prefill_tokens=sum(q for q, _, _ in prefill))
    if prefill:
        meta.prefill_cu_seqlens_q = dev[at["cu"]]
        meta.prefill_seq_lens = dev[at["p_lens"]]
        meta.prefill_block_tables = _table_view(dev, at["p_bt"])
        meta.prefill_max_query_len = max(q for q, _, _ in prefill)
        meta.prefill_max_context = max(c for _, c, _ in prefill)
        meta.prefill_has_prefix = any(c != q for q, c, _ in prefill)
    if decode:
        meta.decode_seq_lens = dev[at["d_lens"]]
        meta.decode_block_tables = _table_view(dev, at["d_bt"])
    return meta


def _table_view(dev: torch.Tensor, at: tuple[slice, int]) -> torch.Tensor:
    span, width = at
    return dev[span].view(-1, width)


class HostPack:
    """int32 arrays laid end to end on the host; `to(device)` moves them in one copy."""

    def __init__(self):
        self.parts: list[np.ndarray] = []
        self.size = 0

    def add(self, values: np.ndarray) -> slice:
        """Append at a 16-byte boundary: Triton specializes kernels on pointer alignment, so unaligned
        views would compile a new variant of a kernel in the middle of serving."""
        pad = -self.size % 4
        if pad:
            self.parts.append(np.zeros(pad, dtype=np.int32))
            self.size += pad
        self.parts.append(values)
        self.size += len(values)
        return slice(self.size - len(values), self.size)

    def add_table(self, tables: list[list[int]]) -> tuple[slice, int]:
        width = max(len(t) for t in tables)
        rows = np.zeros((len(tables), width), dtype=np.int32)
        for i, t in enumerate(tables):
            rows[i, :len(t)] = t
        return self.add(rows.reshape(-1)), width

    def flat(self) -> np.ndarray:
        return np.concatenate(self.parts).astype(np.int32) if self.parts else np.zeros(0, np.int32)

    def to(self, device: torch.device) -> torch.Tensor:
        """One copy from pageable memory: on CUDA it waits for the device's earlier work."""
        return torch.from_numpy(self.flat()).to(device, non_blocking=False)
