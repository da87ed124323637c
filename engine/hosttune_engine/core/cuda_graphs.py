"""Decode steps replayed from CUDA graphs, one graph per captured batch size.

A decode-only step of n sequences runs the graph of the smallest captured size
b >= n. The graph was captured on persistent buffers (`DecodeInputs`): each
step fills their first n rows on the host, pads rows n..b (token 0 at
position 0, cache slot -1 so nothing is written, context length 1) and moves
them with one host-to-device copy. The decode kernel's split count and the
block-table width are fixed per batch size at capture, so no kernel's grid or
strides change between replays. The graph ends with the LM head and a greedy
argmax: fp32 logits [b, V] stay in the graph's memory until the next replay,
and the token ids [b] in a buffer that every graph shares (`DecodeGraphs.tokens`).

A row may take its input token from that buffer instead of the host (its
`feed` entry: the row of the previous step whose token it continues). So a
step can be launched while the previous step's tokens are still on the device
(the argmax, or what the sampler wrote over it): the engine schedules step
N+1 before it reads step N's tokens back.

Off CUDA (tests), the same padded buffers run the model eagerly.
"""

from __future__ import annotations

import bisect
import gc
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.staging import Staging, fed_ids
from hosttune_engine.host_copy import HostCopy
from hosttune_engine.layers.attention import AttentionMetadata


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 to 64, every 16 to 128, every 32 beyond; the largest is max_batch."""
    sizes = [1, 2, 4, 8] + list(range(16, 65, 8)) + list(range(80, 129, 16)) + list(range(160, max_batch + 1, 32))
    return sorted({s for s in sizes if s < max_batch} | {max_batch})


def padded_size(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds n sequences, or None if none does."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def capture_per_size(step: Callable[[int], Any], sizes: list[int]) -> tuple[dict[int, torch.cuda.CUDAGraph], dict]:
    """One graph of `step(size)` per size, largest first, all in one memory pool (a smaller graph reuses the
    larger's memory), and what each capture returned (its output buffers). Each size runs once eagerly
    first: that compiles its kernels and warms cuBLAS outside the capture."""
    graphs, outputs = {}, {}
    pool = torch.cuda.graph_pool_handle()
    with cyclic_gc_held():
        for b in sorted(sizes, reverse=True):
            step(b)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs[b] = step(b)
            graphs[b] = graph
    torch.cuda.synchronize()
    return graphs, outputs


@contextmanager
def cyclic_gc_held():
    """Collect garbage now, then no cyclic collection until the block ends. A collection that ran inside a
    capture would free whatever dead objects it found there, a dead engine's graphs and pinned buffers
    among them, and destroying a graph is a CUDA call a capture forbids: the capture fails, and the CUDA RNG
    is left in capture mode (on the H200 that failed every later test of one pytest worker)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class DecodeInputs:
    """A decode step's inputs, int32, in one host staging buffer and one device buffer of the same layout:
    token ids, positions, cache slots, context lengths, feed rows (`capacity` each), then block tables
    [capacity, width]. A feed row >= 0 means: the input token is row `feed` of the previous step's tokens."""

    HEADER = 5  # token ids, positions, slots, context lengths, feed rows

    def __init__(self, capacity: int, max_blocks_per_seq: int, block_size: int, device: torch.device):
        # rows rounded up to a multiple of 4 keep every view 16-byte aligned (Triton specializes on alignment)
        self.capacity, self.width, self.block_size = -(-capacity // 4) * 4, max_blocks_per_seq, block_size
        capacity = self.capacity
        self.staging = Staging(capacity * (self.HEADER + max_blocks_per_seq), device)
        self._host_views = self._views(self.staging.host.numpy())
        (self.token_ids, self.positions, self.slots, self.seq_lens, self.feed,
         self.block_tables) = self._views(self.staging.device_buffer)
        self._rows: list[tuple[Sequence, int, int] | None] = [None] * capacity  # (seq, preemptions, blocks written)
        self.pad(0, capacity)

    def _views(self, flat):
        c, h = self.capacity, self.HEADER
        return (*(flat[i * c:(i + 1) * c] for i in range(h)), flat[h * c:].reshape(c, self.width))

    def fill(self, seqs: list[Sequence], padded: int, feed: list[int] | None = None) -> None:
        """Rows 0..n for `seqs` (one new token each), rows n..padded as padding, on the host. With `feed`,
        row i's input token is row feed[i] of the previous step's tokens, still on the device (-1: its id)."""
        self.staging.writable()
        n, bs = len(seqs), self.block_size
        ids, pos, slots, lens, feeds, tables = self._host_views
        starts = [s.num_computed_tokens for s in seqs]
        if feed is None:
            ids[:n] = [s.token_ids[p] for s, p in zip(seqs, starts)]
            feeds[:n] = -1
        else:  # a fed row's id is not read (a tensor-parallel rank's mirror does not hold it)
            ids[:n] = [0 if f >= 0 else s.token_ids[p] for s, p, f in zip(seqs, starts, feed)]
            feeds[:n] = feed
        pos[:n] = starts
        lens[:n] = pos[:n] + 1
        for i, seq in enumerate(seqs):
            self._fill_table_row(i, seq, tables)
        p = pos[:n]
        slots[:n] = tables[np.arange(n), p // bs] * bs + p % bs  # the rows now hold each seq's table
        self.pad(n, padded)

    def _fill_table_row(self, i: int, seq: Sequence, tables: np.ndarray) -> None:
        """Write only the blocks this row does not hold yet: a running sequence's table only grows."""
        row, table = self._rows[i], seq.block_table
        done = row[2] if row is not None and row[0] is seq and row[1] == seq.num_preemptions else 0
        if done < len(table):
            tables[i, done:len(table)] = table[done:]
            self._rows[i] = (seq, seq.num_preemptions, len(table))

    def pad(self, start: int, end: int) -> None:
        ids, pos, slots, lens, feeds, _ = self._host_views
        ids[start:end], pos[start:end], slots[start:end], lens[start:end], feeds[start:end] = 0, 0, -1, 1, -1

    def upload(self, padded: int) -> None:
        """One asynchronous copy from pinned memory: the header and the first `padded` block-table rows."""
        self.staging.upload(self.HEADER * self.capacity + padded * self.width)

    def input_ids(self, batch: int, previous: torch.Tensor) -> torch.Tensor:
        """The step's input tokens on the device: the host's, or for fed rows the previous step's."""
        return fed_ids(self.token_ids[:batch], self.feed[:batch], previous)

    def metadata(self, batch: int, num_splits: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slots[:batch], num_prefill_tokens=0,
                                 decode_seq_lens=self.seq_lens[:batch], decode_block_tables=self.block_tables[:batch],
                                 decode_num_splits=num_splits)


class DecodeGraphs:
    """Decode-only steps at the captured batch sizes: `can_run(n)`, then `run(seqs)` -> fp32 logits [n, V]
    and their argmax [n] (a view of `tokens`), and `read_back(n)` to bring the argmax to the host."""

    def __init__(self, step_fn: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor],
                 inputs: DecodeInputs, sizes: list[int], num_splits: Callable[[int], int], use_graphs: bool):
        self.step_fn = step_fn  # (token ids, positions, metadata) -> logits
        self.inputs = inputs
        self.sizes = sorted(sizes)
        self.num_splits = {b: num_splits(b) for b in self.sizes}
        self.use_graphs = use_graphs
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per size: logits [b, V], argmax [b]
        device = inputs.staging.device_buffer.device
        self.tokens = torch.zeros(inputs.capacity, dtype=torch.int32, device=device)  # the last replay's argmax
        pinned = device.type == "cuda"
        self._host_tokens = [torch.zeros(inputs.capacity, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self._turn = 0

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def can_run(self, n: int) -> bool:
        return 0 < n <= self.max_batch

    def _step(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        inp = self.inputs
        logits = self.step_fn(inp.input_ids(b, self.tokens), inp.positions[:b], inp.metadata(b, self.num_splits[b]))
        self.tokens[:b].copy_(logits.argmax(dim=-1))  # after the inputs were read: fed rows read the old tokens
        return logits, self.tokens[:b]

    @torch.inference_mode()
    def capture(self) -> None:
        """One graph per size, largest first, all in one memory pool (a smaller graph reuses the larger's memory)."""
        if not self.use_graphs:
            return
        self.inputs.pad(0, self.inputs.capacity)
        self.inputs.upload(self.max_batch)
        self.graphs, self.outputs = capture_per_size(self._step, self.sizes)

    def run(self, seqs: list[Sequence], feed: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [n, V] and greedy tokens [n] of one decode step of `seqs` (each with exactly one new token),
        enqueued, not waited for. They are views of buffers that the next replay overwrites: use them, or
        `read_back` the tokens, before the next `run`. With `feed`, row i's input token is row feed[i] of the
        previous run's greedy tokens (see `DecodeInputs.fill`)."""
        n = len(seqs)
        b = padded_size(n, self.sizes)
        self.inputs.fill(seqs, b, feed)
        self.inputs.upload(b)
        if self.use_graphs:
            self.graphs[b].replay()
            logits, tokens = self.outputs[b]
        else:
            logits, tokens = self._step(b)
        return logits[:n], tokens[:n]

    def read_back(self, n: int) -> HostCopy:
        """Enqueue the copy of the last run's n greedy tokens to the host (after that run, before the next).
        Two host buffers alternate, so a step's tokens survive the next step's copy."""
        host = self._host_tokens[self._turn][:n]
        self._turn ^= 1
        return HostCopy([self.tokens[:n]], into=[host])
