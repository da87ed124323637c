"""The engine on a real small model: SmolLM2-135M-Instruct with its own tokenizer and chat template."""

import pytest
import torch

from hosttune_engine.errors import ConfigError
from hosttune_engine.llm import LLM
from hosttune_engine.sampling import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
NUM_TOKENS = 12


def _hf_greedy(path, prompt_ids: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NUM_TOKENS, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def test_greedy_tokens_match_transformers(smollm2):
    llm = LLM(model=str(smollm2), dtype="float32", device="cpu", max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    for out in llm.generate(PROMPTS, params):
        assert list(out.token_ids) == _hf_greedy(smollm2, list(out.prompt_token_ids)), out.prompt


def test_chat_template_comes_from_the_checkpoint(smollm2):
    llm = LLM(model=str(smollm2), dtype="float32", device="cpu", max_model_len=512)
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>") and text.rstrip().endswith("<|im_start|>assistant")


def test_three_tensor_parallel_ranks_give_one_gpus_tokens(smollm2):
    """9 attention heads and 3 KV heads: three ranks of 3 query heads and one KV head each."""
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    one = LLM(model=str(smollm2), dtype="float32", device="cpu", max_model_len=512).generate(PROMPTS, params)
    with LLM(model=str(smollm2), dtype="float32", device="cpu", max_model_len=512, tensor_parallel_size=3) as llm:
        three = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in three] == [o.token_ids for o in one]


def test_two_tensor_parallel_ranks_are_refused_naming_the_head_counts(smollm2):
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 must divide the model's 9 attention heads "
                                          r"\(3 KV heads\); use one of 1, 3$"):  # 9 splits no 1536-wide MLP
        LLM(model=str(smollm2), dtype="float32", device="cpu", tensor_parallel_size=2)
