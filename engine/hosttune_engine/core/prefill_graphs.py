"""CUDA graphs for the prefill of one short prompt, the step a lone request's time to first token waits on.

Run eagerly, a prefill step launches about nine kernels a layer, each through Python. Up to about a thousand
tokens the GPU runs them faster than the host enqueues them: on the H200's host a 128-token prefill took
14 ms against 5 ms of kernels, a 600-token one 23 ms against 13 (benchmarks/history/NOTES.md). Here such a step replays a
graph captured per padded length (16 to 1024 tokens, at most 25% padding above 64): one upload of the
inputs, one replay, then the sampler on the last row's logits.

Padding: rows past the prompt get token 0, position 0 and cache slot -1 (the KV write skips it); attention
reads the real rows' keys and values back from the cache (`prefill_has_prefix`), so a cached prefix works
too. Padded rows compute garbage that no real row reads, since every layer but attention works row by row.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np
import torch

from hosttune_engine.core.cuda_graphs import capture_per_size
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.staging import Staging
from hosttune_engine.layers.attention import AttentionMetadata

PREFILL_GRAPH_SIZES = (16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


class PrefillInputs:
    """One prompt chunk's inputs, int32, in a pinned host buffer and a device buffer of the same layout:
    token ids, positions, cache slots (`capacity` each), then query bounds [0, n], the context length, the
    row to sample and the block table (`width`), every field 16-byte aligned."""

    def __init__(self, capacity: int, width: int, block_size: int, device: torch.device):
        self.capacity, self.width, self.block_size = -(-capacity // 4) * 4, width, block_size
        self.staging = Staging(3 * self.capacity + 12 + width, device)
        self._host_views = self._views(self.staging.host.numpy())
        self.token_ids, self.positions, self.slots, self.cu_seqlens, self.seq_lens, self.sample_row, \
            self.block_table = self._views(self.staging.device_buffer)

    def _views(self, flat):
        c = self.capacity
        tail = flat[3 * c:]  # each small field on its own 16 bytes: Triton specializes on alignment
        return (flat[:c], flat[c:2 * c], flat[2 * c:3 * c], tail[0:2], tail[4:5], tail[8:9],
                tail[12:].reshape(1, self.width))

    def fill(self, seq: Sequence, n: int, padded: int) -> None:
        """The next n tokens of `seq` in rows 0..n, padding in rows n..padded, on the host."""
        self.staging.writable()
        ids, pos, slots, cu, lens, row, table = self._host_views
        start, bs = seq.num_computed_tokens, self.block_size
        ids[:n] = seq.token_ids[start:start + n]
        pos[:n] = np.arange(start, start + n)
        table[0, :len(seq.block_table)] = seq.block_table
        slots[:n] = table[0, pos[:n] // bs] * bs + pos[:n] % bs
        ids[n:padded], pos[n:padded], slots[n:padded] = 0, 0, -1
        cu[:], lens[0], row[0] = (0, n), start + n, n - 1

    def pad_all(self) -> None:
        """Every row padding (no cache slot written) and a one-token query: what the capture runs on."""
        ids, pos, slots, cu, lens, row, _ = self._host_views
        ids[:], pos[:], slots[:] = 0, 0, -1
        cu[:], lens[0], row[0] = (0, 1), 1, 0

    def upload(self) -> None:
        self.staging.upload()

    def metadata(self, padded: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slots[:padded], num_prefill_tokens=padded,
                                 prefill_cu_seqlens_q=self.cu_seqlens, prefill_seq_lens=self.seq_lens,
                                 prefill_block_tables=self.block_table, prefill_max_query_len=padded,
                                 prefill_has_prefix=True)


class PrefillGraphs:
    """`can_run(sched)`, then `run(seq, n)` -> fp32 logits [1, V] of the chunk's last token, enqueued, not
    waited for (a view the next `run` overwrites). With `use_graphs` False the padded step runs eagerly:
    how CPU tests exercise this path."""

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor],
                 logits: Callable[[torch.Tensor], torch.Tensor], inputs: PrefillInputs, use_graphs: bool,
                 sizes: tuple[int, ...] = PREFILL_GRAPH_SIZES):
        self.forward, self.logits, self.inputs, self.use_graphs = forward, logits, inputs, use_graphs
        self.sizes = sorted(s for s in sizes if s <= inputs.capacity)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def can_run(self, sched: SchedulerOutput) -> bool:
        """One sequence, a chunk of more than one token that fits the largest size."""
        return (len(sched.seqs) == 1 and bool(self.sizes)
                and 1 < sched.num_new_tokens[0] <= self.sizes[-1])

    def _step(self, padded: int) -> torch.Tensor:
        inp = self.inputs
        hidden = self.forward(inp.token_ids[:padded], inp.positions[:padded], inp.metadata(padded))
        return self.logits(hidden.index_select(0, inp.sample_row))  # [1, V] fp32

    @torch.inference_mode()
    def capture(self) -> None:
        """One graph per size, largest first, in one memory pool. The warm-up runs write no cache slot."""
        if not self.use_graphs:
            return
        self.inputs.pad_all()
        self.inputs.upload()
        self.graphs, self.outputs = capture_per_size(self._step, self.sizes)

    def run(self, seq: Sequence, n: int) -> torch.Tensor:
        b = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.inputs.fill(seq, n, b)
        self.inputs.upload()
        if not self.use_graphs:
            return self._step(b)
        self.graphs[b].replay()
        return self.outputs[b]
