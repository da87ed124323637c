#!/usr/bin/env python3
"""Write a tiny random-weight Llama and a tiny Qwen2 model folder, for tests.

Each folder is what a Hugging Face checkpoint looks like: config.json,
generation_config.json, safetensors weights (the Llama in two shards with an
index, the Qwen2 in one file with tied embeddings), tokenizer.json trained here
on a small built-in text (byte-level BPE), and tokenizer_config.json with a chat
template. Nothing is downloaded. Output is deterministic for a given seed.

Example: python engine/scripts/make_tiny_models.py /tmp/tiny-models
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TEXT = """\
A host is ready to serve a language model when its driver matches its toolkit, its clocks
stay high under load, and its interrupts land on the cores next to the GPU. The engine
reads a prompt, splits it into tokens, and fills a cache of keys and values one block at
a time. Blocks that hold the same prefix are shared, so a second request that starts with
the same system prompt skips most of its prefill. When memory runs short, the scheduler
pauses the newest request, frees its blocks, and computes them again later.
Every kernel has a reference written in plain torch. Tests compare the two on many shapes:
short and long sequences, ragged batches, one or seven query heads per key head.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
Numbers too: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.71 42. Punctuation, "quotes", (brackets)!
User: what is the capital of France? Assistant: Paris is the capital of France.
User: write a haiku about GPUs. Assistant: silicon rivers / carry warm tensors at night / tokens fall like rain.
"""

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 32, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 256},
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "torch_dtype": "float32",
}
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
    "intermediate_size": 192, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": None,
    "max_window_layers": 3, "hidden_act": "silu", "torch_dtype": "float32",
}
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA_CHAT = (
    "{{ bos_token }}{% for message in messages %}{{ '[' + message['role'] + '] ' + message['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '[assistant] ' }}{% endif %}"
)


# Qwen2's pre-tokenizer split (as in its tokenizer.json): digits one by one, words with their space.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(special: list[str], bos: str | None, vocab_size: int = 384, split: str | None = None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    if bos is not None:  # Llama-style: every encoded text starts with BOS
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def random_weights(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights scaled so activations stay O(1) and attention is sharp enough to matter."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    hq, hkv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    qkv_bias = cfg["model_type"] == "qwen2"

    def w(out, inp, gain=1.0):
        return torch.randn(out, inp, generator=gen) * gain / inp**0.5

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    # With tied embeddings a strong residual makes the model repeat its input token; keep it weaker.
    embed_std, out_gain = (0.3, 3.0) if cfg["tie_word_embeddings"] else (1.0, 1.0)
    t = {"model.embed_tokens.weight": embed_std * torch.randn(v, h, generator=gen), "model.norm.weight": norm(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
              p + "self_attn.q_proj.weight": w(hq, h, 2.0), p + "self_attn.k_proj.weight": w(hkv, h, 2.0),
              p + "self_attn.v_proj.weight": w(hkv, h), p + "self_attn.o_proj.weight": w(h, hq, out_gain),
              p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
              p + "mlp.down_proj.weight": w(h, inter, out_gain)}
        if qkv_bias:
            for name, n in (("q_proj", hq), ("k_proj", hkv), ("v_proj", hkv)):
                t[p + f"self_attn.{name}.bias"] = 0.1 * torch.randn(n, generator=gen)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(v, h, 2.0)
    return t


def write_model(out: Path, cfg: dict, special: list[str], bos: str | None, eos: str, chat: str, seed: int,
                shards: int, split: str | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(special, bos, split=split)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in special}
    cfg = {**cfg, "vocab_size": tok.get_vocab_size(), "eos_token_id": ids[eos],
           "bos_token_id": ids[bos] if bos else None}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ids[eos], "do_sample": False}))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
        "chat_template": chat, "model_max_length": cfg["max_position_embeddings"]}, indent=2))
    _save_shards(out, random_weights(cfg, torch.Generator().manual_seed(seed)), shards)
    return out


def _save_shards(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(out / "model.safetensors"))
        return
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        save_file({n: tensors[n].contiguous() for n in part}, str(out / fname))
        weight_map |= dict.fromkeys(part, fname)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def make_tiny_models(root: str | Path, seed: int = 0) -> dict[str, Path]:
    root = Path(root)
    return {
        "llama": write_model(root / "tiny-llama", LLAMA, ["<s>", "</s>"], "<s>", "</s>", LLAMA_CHAT, seed, 2),
        "qwen2": write_model(root / "tiny-qwen2", QWEN2, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None,
                             "<|im_end|>", CHATML, seed + 1, 1, split=QWEN2_SPLIT),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder to write tiny-llama/ and tiny-qwen2/ into")
    parser.add_argument("--seed", type=int, default=0)
    for name, path in make_tiny_models(parser.parse_args().out, parser.parse_args().seed).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
