"""Piecewise CUDA graphs for mixed steps: prefill chunks beside decodes, or more decodes than the decode graphs hold.

Run eagerly, such a step launches about ten kernels a layer through Python (about 280 for a 28-layer
model), and while its chunk is short (up to a few hundred tokens) the GPU finishes them faster than the
host enqueues them. Attention
is what cannot be captured once for every such step: its grids and metadata depend on the step's
sequences (how many prefills, their lengths, the decodes' contexts). Everything else depends on the token
count alone. So the model is cut at its attention calls (`LlamaModel.segment`): segment 0 is the
embedding and layer 0 up to its written qkv, segment k (0 < k < L) layer k-1 after attention (o_proj,
norm, MLP) and layer k up to its qkv (norm, QKV projection, RoPE and the KV-cache write), segment L the
last layer's rest and the final norm. Each segment is captured per padded token count (a bucket).

A step of n tokens runs in the smallest bucket b >= n: its ids, positions and cache slots go into static
buffers (rows n..b: token 0, position 0, slot -1, so padding writes no cache slot), then per layer the
step replays segment k's graph and runs attention k eagerly on the n real rows, into a static buffer that
segment k+1's graph reads. Padded rows compute values no real row reads: every layer but attention works
row by row. Each segment copies its outputs (qkv, residual, or the final hidden states) into static
buffers [capacity, ...] that all buckets share, so the graphs of every bucket take one set of them. The
LM head then runs eagerly on the sampled rows, as on the eager path.

Off CUDA (tests), the same padded buffers run the segments eagerly (`use_graphs` False).
"""

from __future__ import annotations

import bisect

import torch
from torch import nn

from hosttune_engine.core.cuda_graphs import cyclic_gc_held
from hosttune_engine.core.staging import Staging, Uploads
from hosttune_engine.core.step_inputs import HostPack, StepPlan, feed_tokens, pack_attention

# Token counts captured (those up to the step's token budget). On an idle H200 (7B shape, 64 decodes beside
# a chunk) the graphs took a mixed step of 80-320 tokens from 16-30 ms to 10-12 ms and matched eager at 576:
# past that such a step's kernels outlast their launches. In a server under load, though, the eager path's
# 280 launches share the interpreter with the HTTP threads: eager steps of 650-1100 tokens took 36-48 ms
# where the idle estimate said 25-30. So the buckets go on to 1,024 (a step held to a time budget stays
# within the last one: core/scheduler.py), at most 1/6 apart past 640 (below about 256 tokens the GEMMs read
# the weights in the same time whatever the rows, so padding costs little there). Past the last, steps run
# eagerly.
MIXED_GRAPH_SIZES = (32, 64, 128, 192, 256, 320, 384, 448, 512, 576, 640, 768, 896, 1024)


def mixed_sizes(max_tokens: int, sizes: tuple[int, ...] = MIXED_GRAPH_SIZES) -> list[int]:
    """The buckets that a step of at most `max_tokens` tokens can use."""
    return sorted(s for s in sizes if s <= max_tokens)


class MixedInputs:
    """A mixed step's token ids, positions, cache slots and feed rows (int32, `capacity` each) in a pinned
    host buffer and a device buffer of the same layout. A feed row >= 0: the token's id is that row of the
    previous step's tokens, still on the device (`feed`)."""

    def __init__(self, capacity: int, device: torch.device):
        self.capacity = -(-capacity // 4) * 4  # 16-byte aligned views: Triton specializes on alignment
        self.staging = Staging(4 * self.capacity, device)
        self._host_views = self._views(self.staging.host.numpy())
        self.token_ids, self.positions, self.slots, self.feed_rows = self._views(self.staging.device_buffer)

    def _views(self, flat):
        c = self.capacity
        return tuple(flat[i * c:(i + 1) * c] for i in range(4))

    def fill(self, plan: StepPlan, padded: int) -> None:
        """The plan's n tokens in rows 0..n, padding in rows n..padded, on the host."""
        self.staging.writable()
        ids, pos, slots, feed = self._host_views
        n = plan.num_tokens
        ids[:n], pos[:n], slots[:n] = plan.ids, plan.positions, plan.slots
        feed[:n] = -1 if plan.feed is None else plan.feed
        ids[n:padded], pos[n:padded], slots[n:padded], feed[n:padded] = 0, 0, -1, -1

    def pad_all(self) -> None:
        """Every row padding: what the capture runs on."""
        ids, pos, slots, feed = self._host_views
        ids[:], pos[:], slots[:], feed[:] = 0, 0, -1, -1

    def upload(self) -> None:
        """One asynchronous copy of all four fields."""
        self.staging.upload()

    def feed(self, n: int, source: torch.Tensor) -> None:
        """The fed rows' token ids from `source`, the previous step's tokens, on the device."""
        feed_tokens(self.token_ids[:n], self.feed_rows[:n], source)


class SegmentBuffers:
    """What flows between segments and attention, [capacity, ...] in the model's dtype: each layer's qkv
    (rotated, written to the cache), the residual stream, attention's output, the final hidden states."""

    def __init__(self, capacity: int, qkv_width: int, hidden: int, heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.qkv = torch.zeros(capacity, qkv_width, dtype=dtype, device=device)
        self.residual = torch.zeros(capacity, hidden, dtype=dtype, device=device)
        self.attn_out = torch.zeros(capacity, heads, head_dim, dtype=dtype, device=device)
        self.hidden = torch.zeros(capacity, hidden, dtype=dtype, device=device)

    @classmethod
    def for_model(cls, model: nn.Module, capacity: int, device: torch.device) -> SegmentBuffers:
        """Sized from the first layer's projections and attention (this rank's shard with tensor parallelism)."""
        layer = model.model.layers[0]
        attn = layer.self_attn.attn
        hidden = model.model.norm.weight.shape[0]
        return cls(capacity, layer.self_attn.qkv_proj.out_features, hidden, attn.num_heads, attn.head_dim,
                   model.model.norm.weight.dtype, device)


class MixedGraphs:
    """`can_run(num_tokens)`, then `run(plan)` -> (final hidden states [n, H], sampled rows [N]), enqueued,
    not waited for (views that the next `run` overwrites)."""

    def __init__(self, model: nn.Module, inputs: MixedInputs, buffers: SegmentBuffers, sizes: list[int],
                 use_graphs: bool, num_kv_heads: int, num_sms: int):
        self.model, self.inputs, self.buffers = model, inputs, buffers
        self.sizes = sorted(s for s in sizes if s <= inputs.capacity)
        self.use_graphs, self.num_kv_heads, self.num_sms = use_graphs, num_kv_heads, num_sms
        self.num_segments = model.model.num_segments
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}  # per bucket, one graph per segment
        self.uploads = Uploads(inputs.staging.device_buffer.device)  # the attention metadata's pinned buffer

    def can_run(self, num_tokens: int) -> bool:
        return bool(self.sizes) and 0 < num_tokens <= self.sizes[-1]

    def bucket(self, num_tokens: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, num_tokens)]

    def _segment(self, b: int, k: int) -> None:
        """Segment k on the first b rows of the static buffers, its outputs copied into them."""
        inp, buf, last = self.inputs, self.buffers, self.num_segments - 1
        x = inp.token_ids[:b] if k == 0 else buf.attn_out[:b]
        out, residual = self.model.model.segment(k, x, buf.residual[:b] if k else None, inp.positions[:b],
                                                 inp.slots[:b])
        if k == last:
            buf.hidden[:b].copy_(out)
            return
        buf.qkv[:b].copy_(out)
        buf.residual[:b].copy_(residual)

    @torch.inference_mode()
    def capture(self) -> None:
        """Every segment of every bucket, largest bucket first, all in one memory pool (each capture's
        intermediates are freed when it ends, for the next one to reuse). Each segment runs once eagerly
        first: that compiles its kernels and warms cuBLAS outside the capture. The runs write no cache slot."""
        if not self.use_graphs or not self.sizes:
            return
        self.inputs.pad_all()
        self.inputs.upload()
        pool = torch.cuda.graph_pool_handle()
        with cyclic_gc_held():
            for b in sorted(self.sizes, reverse=True):
                self.graphs[b] = [self._capture_one(b, k, pool) for k in range(self.num_segments)]
        torch.cuda.synchronize()

    def _capture_one(self, b: int, k: int, pool) -> torch.cuda.CUDAGraph:
        self._segment(b, k)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._segment(b, k)
        return graph

    def run(self, plan: StepPlan, source: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: the inputs uploaded, then segment, attention, ..., segment; the hidden states of its
        n real rows and the rows to sample. Nothing waits for the device, so the step can be enqueued while
        the one before still runs; `source` holds that step's tokens for the plan's fed rows."""
        n = plan.num_tokens
        b = self.bucket(n)
        inp, buf, model = self.inputs, self.buffers, self.model.model
        inp.fill(plan, b)
        inp.upload()
        if plan.feed is not None:
            inp.feed(n, source)
        _, meta, rows = pack_attention(plan, HostPack(), inp.slots.device, self.num_kv_heads, self.num_sms,
                                       self.uploads)
        meta.slot_mapping = inp.slots[:n]
        out = buf.attn_out[:n]
        for k in range(self.num_segments - 1):
            self._replay(b, k)
            model.attention(k, buf.qkv, meta, out=out)
        self._replay(b, self.num_segments - 1)
        return buf.hidden[:n], rows

    def _replay(self, b: int, k: int) -> None:
        if self.use_graphs:
            self.graphs[b][k].replay()
        else:
            self._segment(b, k)

