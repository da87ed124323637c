"""Hugging Face transformers as the test oracle: same folder, same weights, fp32 on CPU."""

import functools

import torch


@functools.lru_cache(maxsize=None)
def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def hf_greedy(path, prompt_ids, max_new_tokens):
    """Greedy continuation (EOS ignored) and the logits of every generated step [N, V]."""
    ids = torch.tensor([list(prompt_ids)])
    out = hf_model(str(path)).generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
        do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
    )
    return out.sequences[0, len(prompt_ids):].tolist(), torch.cat(out.logits).float()


@torch.no_grad()
def hf_logits(path, ids):
    return hf_model(str(path))(torch.tensor([list(ids)])).logits[0].float()


def prompt_ids(n: int, seed: int, vocab: int = 300) -> list[int]:
    """A deterministic prompt of n token ids."""
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
