"""Tensor parallelism as a transform of a built model (before its weights are loaded).

Column-parallel: qkv_proj (this rank's query and KV heads) and gate_up_proj (its MLP columns), no
communication. Row-parallel: o_proj and down_proj take this rank's slice of their input and all-reduce
their output, one all-reduce each. The embedding and the LM head hold a slice of the vocabulary: the
embedding all-reduces its rows, the logits are gathered (`gather_logits`, applied after the one-row GEMV
transform, so the gather wraps whichever path computed them). Each changed layer records, for the loader,
the part of each checkpoint tensor it holds: `tp_shards` by parameter name ("weight", "bias"), `tp_parts`
by part of a fused layer ("q", "k", "v", "gate", "up").
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from hosttune_engine.layers.linear import Linear, MergedLinear
from hosttune_engine.parallel.group import TensorParallelGroup
from hosttune_engine.parallel.layout import ShardLayout
from hosttune_engine.model.shard import Shard, shard_of
from hosttune_engine.parallel.quant_split import split_quantized
from hosttune_engine.quant.spec import QuantSpec


class VocabParallelEmbedding(nn.Embedding):
    """Rows `first_row : first_row + num_embeddings` of the embedding; ids elsewhere give zeros before the
    all-reduce, which adds the one rank that holds each id."""

    def __init__(self, rows: int, hidden: int, first_row: int, group: TensorParallelGroup):
        super().__init__(rows, hidden)
        self.first_row, self.group = first_row, group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.first_row  # [T]
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)  # [T, H]
        return self.group.all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0))


def shard_model(model: nn.Module, layout: ShardLayout, group: TensorParallelGroup, spec: QuantSpec | None = None) -> None:
    """Replace the layers of a model built on the meta device by this rank's shards of them. The loader
    calls it with the model's dtype as torch's default dtype (`model.loader.build_model`), and with the
    quantization `spec` its projections will be swapped for: ConfigError unless they split into whole FP8
    blocks and 4-bit groups (`parallel/quant_split.py`)."""
    cfg = model.config
    model.shard_layout = layout  # what its kernel plan reads its projections' shapes from (planner/prepare.py)
    with torch.device("meta"):
        for layer in model.model.layers:
            _shard_attention(layer.self_attn, layout, group, cfg.head_dim)
            _shard_mlp(layer.mlp, layout, group)
        _shard_vocab(model, layout, group)
    model.requires_grad_(False)
    if spec is not None:
        split_quantized(model, spec, layout.world_size, group)


def gather_logits(model: nn.Module, group: TensorParallelGroup) -> None:
    """Make `compute_logits` return the logits of the whole vocabulary: [N, V] fp32 on every rank."""
    model.compute_logits = partial(_gathered_logits, model.compute_logits, group, model.config.vocab_size)


def _gathered_logits(local, group: TensorParallelGroup, vocab_size: int, hidden: torch.Tensor) -> torch.Tensor:
    logits = group.gather_columns(local(hidden))  # [N, R * V / R padded]
    return logits if logits.shape[1] == vocab_size else logits[:, :vocab_size]


def _shard_attention(attn: nn.Module, layout: ShardLayout, group: TensorParallelGroup, d: int) -> None:
    q, kv = layout.num_heads * d, layout.num_kv_heads * d
    q0, kv0 = layout.first_head * d, layout.first_kv_head * d
    old = attn.qkv_proj
    attn.qkv_proj = MergedLinear(old.in_features, {"q": q, "k": kv, "v": kv}, bias=old.bias is not None)
    attn.qkv_proj.tp_parts = {"q": shard_of(q0, q0 + q), "k": shard_of(kv0, kv0 + kv), "v": shard_of(kv0, kv0 + kv)}
    attn.num_heads, attn.num_kv_heads, attn.split_sizes = layout.num_heads, layout.num_kv_heads, [q, kv, kv]
    attn.attn.num_heads, attn.attn.num_kv_heads = layout.num_heads, layout.num_kv_heads
    attn.o_proj = _row_parallel(attn.o_proj, q0, q, layout, group)


def _shard_mlp(mlp: nn.Module, layout: ShardLayout, group: TensorParallelGroup) -> None:
    width, start = layout.intermediate_size, layout.rank * layout.intermediate_size
    old = mlp.gate_up_proj
    mlp.gate_up_proj = MergedLinear(old.in_features, {"gate": width, "up": width}, bias=old.bias is not None)
    mlp.gate_up_proj.tp_parts = dict.fromkeys(("gate", "up"), shard_of(start, start + width))
    mlp.down_proj = _row_parallel(mlp.down_proj, start, width, layout, group)


def _row_parallel(old: nn.Linear, start: int, width: int, layout: ShardLayout,
                  group: TensorParallelGroup) -> Linear:
    """Input columns `start : start + width` of `old`, its output summed over the ranks by a forward hook:
    the hook runs after whichever kernel the layer's plan picks. The bias is
    rank 0's alone, so the sum adds it once."""
    new = Linear(width, old.out_features, bias=old.bias is not None)
    new.tp_shards = {"weight": Shard(1, start, start + width, width)}
    new.tp_in_features = old.in_features
    if new.bias is not None:
        n = old.out_features
        new.tp_shards["bias"] = shard_of(0, n) if layout.rank == 0 else Shard(0, 0, 0, n)
    new.register_forward_hook(lambda module, args, out: group.all_reduce(out))
    return new


def _shard_vocab(model: nn.Module, layout: ShardLayout, group: TensorParallelGroup) -> None:
    rows, first = layout.vocab_rows, layout.first_vocab_row
    shard = Shard(0, first, first + rows, rows)  # read_tensor pads the last rank's rows past the vocabulary
    hidden = model.config.hidden_size
    embed = model.model.embed_tokens = VocabParallelEmbedding(rows, hidden, first, group)
    embed.tp_shards = {"weight": shard}
    model.lm_head = Linear(hidden, rows, bias=False)
    model.lm_head.tp_shards = {"weight": shard}
    if model.config.tie_word_embeddings:
        model.lm_head.weight = embed.weight
