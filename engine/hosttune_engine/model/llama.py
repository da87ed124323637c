"""Llama and Qwen2 decoder-only transformers (RMSNorm, RoPE, GQA, SwiGLU, optional QKV bias).

Module names follow the Hugging Face checkpoints, except the fused projections
`qkv_proj` (q, k, v) and `gate_up_proj` (gate, up), which the loader fills from
the separate checkpoint tensors. The model is plain: tensor parallelism and
quantization are transforms of it, and its kernel plan's preparation puts in
`PreparedDecoderLayer`s, whose norms and activation run with the projections
they feed where the plan fuses them.
"""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.layers.activation import SiluAndMul
from hosttune_engine.layers.attention import Attention, AttentionMetadata
from hosttune_engine.layers.fused import NormLinear, NormMLP
from hosttune_engine.layers.linear import Linear, MergedLinear, logits
from hosttune_engine.layers.norm import RMSNorm
from hosttune_engine.layers.rotary import RotaryEmbedding
from hosttune_engine.model.model_config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = MergedLinear(cfg.hidden_size, {"q": q_size, "k": kv_size, "v": kv_size}, bias=cfg.qkv_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.rotary = rotary
        self.attn = Attention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim**-0.5)

    def project(self, positions: torch.Tensor, x: torch.Tensor, slot_mapping: torch.Tensor | None) -> torch.Tensor:
        """x [T, H] -> qkv [T, (Hq + 2 Hkv) * D], rotated, its k and v written to the cache (left to `attend`
        when slot_mapping is None)."""
        return self.place(positions, self.qkv_proj(x), slot_mapping)

    def place(self, positions: torch.Tensor, qkv: torch.Tensor, slot_mapping: torch.Tensor | None) -> torch.Tensor:
        """qkv [T, W] rotated and its k and v written to the cache (left to `attend` when slot_mapping is None)."""
        if slot_mapping is not None:
            self.attn.write(positions, qkv, self.rotary.cos_sin, slot_mapping)
        return qkv

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """An unwritten qkv (`project` without slots) -> rotated, written and attended: [T, Hq, D]."""
        return self.attn.write_attend(positions, qkv, self.rotary.cos_sin, meta)

    def output(self, o: torch.Tensor) -> torch.Tensor:
        return self.o_proj(o.view(o.shape[0], -1))  # [T, Hq, D] -> [T, H]


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = MergedLinear(cfg.hidden_size, {"gate": inter, "up": inter}, bias=False)
        self.down_proj = Linear(inter, cfg.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))  # [T, H] -> [T, 2I] -> [T, I] -> [T, H]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def before_attention(self, positions, hidden, residual, slot_mapping):
        """hidden [T, H] (and the residual, None in the first layer) -> (qkv written to the cache, residual)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        return self.self_attn.project(positions, hidden, slot_mapping), residual

    def after_attention(self, o, residual):
        """The attention output o [T, Hq, D] -> (hidden [T, H], residual) for the next layer."""
        hidden, residual = self.post_attention_layernorm(self.self_attn.output(o), residual)
        return self.mlp(hidden), residual

    def prepared(self) -> PreparedDecoderLayer:
        """This layer as its kernel plan runs it (the same norms, attention and MLP)."""
        return PreparedDecoderLayer(self)


class PreparedDecoderLayer(LlamaDecoderLayer):
    """A decoder layer as its kernel plan runs it, made from a plain one once tensor parallelism and
    quantization have shaped it: the norm feeding qkv_proj, and the MLP behind its norm, are fused modules
    (layers/fused.py) that per call run the plan's fused kernels or the plain steps. Its children are the plain
    layer's, under the same names."""

    def __init__(self, plain: LlamaDecoderLayer):
        nn.Module.__init__(self)
        self.input_layernorm, self.self_attn = plain.input_layernorm, plain.self_attn
        self.post_attention_layernorm, self.mlp = plain.post_attention_layernorm, plain.mlp
        self.qkv_input = NormLinear(self.input_layernorm, self.self_attn.qkv_proj)
        self.norm_mlp = NormMLP(self.post_attention_layernorm, self.mlp)

    def before_attention(self, positions, hidden, residual, slot_mapping):
        qkv, residual = self.qkv_input(hidden, residual)
        return self.self_attn.place(positions, qkv, slot_mapping), residual

    def after_attention(self, o, residual):
        return self.norm_mlp(self.self_attn.output(o), residual)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, rotary) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # RoPE and the cache write are left to attention, which runs them in its own kernel for a step of decodes
        # alone (Triton path) and first otherwise.
        x, residual = input_ids, None
        for k in range(len(self.layers)):
            qkv, residual = self.segment(k, x, residual, positions, None)
            x = self.layers[k].self_attn.attend(positions, qkv, meta)
        hidden, _ = self.segment(len(self.layers), x, residual, positions, None)
        return hidden

    # The forward cut at its attention calls: segment 0, attention 0, segment 1, ..., segment L. A segment's
    # shapes depend on the token count alone, so a piecewise CUDA graph captures it (`core.mixed_graphs`);
    # attention's depend on the step's sequences, so it runs between the replays.
    @property
    def num_segments(self) -> int:
        return len(self.layers) + 1

    def segment(self, k: int, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                slot_mapping: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Segment k: from the input ids [T] (k = 0) or layer k-1's attention output [T, Hq, D] to layer k's
        written qkv (unwritten when slot_mapping is None) and the residual; the last segment (k = L) ends with the
        final norm: (hidden [T, H], None)."""
        if k == 0:
            hidden = self.embed_tokens(x)  # [T, H]
        else:
            hidden, residual = self.layers[k - 1].after_attention(x, residual)
        if k == len(self.layers):
            hidden, _ = self.norm(hidden, residual)
            return hidden, None
        return self.layers[k].before_attention(positions, hidden, residual, slot_mapping)

    def attention(self, k: int, qkv: torch.Tensor, meta: AttentionMetadata,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        """Layer k's attention over the cache: qkv [>= T, W] -> [T, Hq, D] (into `out`), T = len(slot_mapping)."""
        return self.layers[k].self_attn.attn.attend_qkv(qkv, meta, out)


class LlamaForCausalLM(nn.Module):
    # checkpoint name part -> (fused module name part, shard)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, H]."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> fp32 logits [N, V]."""
        return logits(self.lm_head, hidden)


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 is Llama with biases on q, k and v (set from the config)."""


MODEL_CLASSES = {"LlamaForCausalLM": LlamaForCausalLM, "Qwen2ForCausalLM": Qwen2ForCausalLM}
