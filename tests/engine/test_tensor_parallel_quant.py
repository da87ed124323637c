"""Tensor parallelism with quantized weights on CPU (gloo): SmolLM2-135M written by the engine's writer in each
layout gives, on three ranks, one process's greedy tokens, and rank 0 holds the bytes the preflight counts.

At three ranks a rank holds 192 query rows, 64 KV rows (one of the 3 KV heads), 512 MLP columns, and 192 of
o_proj's 576 input columns: groups of 64 split whole, FP8 blocks of 128 do not (written with blocks of 64
here, and refused with 128). The act-order GPTQ checkpoint scatters each group over K, so its row-parallel
layers hold whole groups of the group-sorted columns and gather their input from every rank.
"""

import dataclasses
import functools

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.errors import ConfigError
from hosttune_engine.model import loader
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.checks import check_startup, shard_bytes, weight_bytes
from hosttune_engine.parallel.layout import ShardLayout
from hosttune_engine.parallel.transform import shard_model
from hosttune_engine.quant.sharding import tensor_part
from hosttune_engine.quant.spec import Layout, QuantSpec

from .oracle import prompt_ids
from .quant_checkpoints import cached_pair
from .test_oracle import run

# Each layout with the KV cache it runs beside: two with the e4m3 cache, split by KV heads like the weights.
LAYOUTS = {"fp8-block-64": "auto", "fp8-channel": "auto", "fp8-tensor": "fp8", "awq-g64": "auto",
           "gptq-g64-sym": "fp8", "gptq-g64-zeros-act-order": "auto"}
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="session")
def quantized(smollm2):
    """name -> SmolLM2 written in that layout (cached on disk by the writer's version)."""
    return functools.cache(lambda name: cached_pair(smollm2, name)[0])


def _generate(folder, tp: int, kv_cache_dtype: str) -> tuple[dict[str, list[int]], int]:
    """Greedy tokens of two requests prefilled together, and rank 0's weight bytes."""
    eng = Engine(EngineConfig(model=str(folder), dtype="float32", device="cpu", tensor_parallel_size=tp,
                              block_size=8, num_kv_blocks=8, max_num_seqs=2, max_model_len=64,
                              kv_cache_dtype=kv_cache_dtype))
    try:
        weights = weight_bytes(eng.runner.model)
        tokens = run(eng, {0: [EngineRequest("a", prompt_ids(9, seed=1, vocab=5000), GREEDY),
                               EngineRequest("b", prompt_ids(5, seed=2, vocab=5000), GREEDY)]})
    finally:
        eng.shutdown()
    return tokens, weights


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_three_ranks_give_one_process_greedy_tokens(quantized, name):
    folder = quantized(name)
    one, whole = _generate(folder, 1, LAYOUTS[name])
    three, shard = _generate(folder, 3, LAYOUTS[name])
    assert three == one and all(len(t) == GREEDY.max_tokens for t in one.values())
    cfg = ModelConfig.from_folder(folder)
    assert shard == shard_bytes(cfg, 3, torch.float32, cfg.quantization)  # what the preflight counts, exactly
    assert whole / 3 < shard < whole / 3 * 1.01  # norms and per-channel scales are all a rank repeats


def test_blocks_a_rank_cannot_hold_whole_are_refused_before_any_rank_starts(quantized, monkeypatch):
    """SmolLM2 in 128x128 FP8 blocks at three ranks: 192 query rows a rank are one and a half blocks."""
    from hosttune_engine.core import workers

    monkeypatch.setattr(workers, "open_store", lambda size: pytest.fail("a rank was started"))
    with pytest.raises(ConfigError) as refused:
        Engine(EngineConfig(model=str(quantized("fp8-block")), dtype="float32", device="cpu", tensor_parallel_size=3))
    assert str(refused.value) == (
        "model.layers.0.self_attn.q_proj.weight: tensor_parallel_size=3 gives a rank its output rows 0:192, not "
        "whole 128-row FP8 blocks (fp8-block); use a tensor_parallel_size whose share is a multiple of 128")


# The tiny Llama at two ranks: 64 query rows, its one KV head's 32 rows, 128 MLP columns, 64 o_proj columns.
REFUSED = {
    "fp8 blocks of 128 rows": (QuantSpec(Layout.FP8_BLOCK, block=(128, 128)),
                               "q_proj.weight: .* output rows 0:64, not whole 128-row FP8 blocks"),
    "fp8 blocks of 64 rows": (QuantSpec(Layout.FP8_CT_BLOCK, block=(64, 32)),
                              "k_proj.weight: .* output rows 0:32, not whole 64-row FP8 blocks"),
    "fp8 blocks of 128 columns": (QuantSpec(Layout.FP8_BLOCK, block=(32, 128)),
                                  "o_proj.weight: .* input columns 0:64, not whole 128-column FP8 blocks"),
    "awq groups of 128": (QuantSpec(Layout.AWQ, group_size=128),
                          "o_proj.weight: .* input columns 0:64, not whole 128-column groups"),
    "act-order groups of 128": (QuantSpec(Layout.GPTQ, group_size=128, desc_act=True, zero_offset=1),
                                "o_proj.weight: .* input columns 0:64, not whole 128-column groups"),
}
SPLIT = {
    "fp8 blocks of 32": QuantSpec(Layout.FP8_BLOCK, block=(32, 32)),
    "fp8 per channel": QuantSpec(Layout.FP8_CHANNEL),
    "fp8 per tensor": QuantSpec(Layout.FP8_TENSOR),
    "awq groups of 32": QuantSpec(Layout.AWQ, group_size=32),
    "act-order groups of 64": QuantSpec(Layout.GPTQ, group_size=64, desc_act=True, zero_offset=1),
}


def _check(tiny_models, spec: QuantSpec) -> None:
    path = tiny_models["llama"]
    cfg = dataclasses.replace(ModelConfig.from_folder(path), quantization=spec)
    check_startup(EngineConfig(model=str(path), device="cpu", tensor_parallel_size=2), cfg, torch.device("cpu"),
                  torch.float32)


@pytest.mark.parametrize("case", list(REFUSED))
def test_groups_and_blocks_that_do_not_split_are_refused_in_one_line(tiny_models, case):
    spec, message = REFUSED[case]
    with pytest.raises(ConfigError, match=r"^model\.layers\.0\.\w+\." + message) as refused:
        _check(tiny_models, spec)
    assert "\n" not in str(refused.value) and "tensor_parallel_size=2" in str(refused.value)


@pytest.mark.parametrize("case", list(SPLIT))
def test_groups_and_blocks_that_split_pass(tiny_models, case):
    _check(tiny_models, SPLIT[case])


# Rank 0 of three on the act-order GPTQ checkpoint (groups of 64): the shape of what it reads of layer 0's tensors.
READ_BY_RANK_0 = {
    "self_attn.q_proj.qweight": [72, 192], "self_attn.k_proj.qweight": [72, 64],  # [K/8, N]: its rows of N
    "self_attn.q_proj.qzeros": [9, 24], "self_attn.q_proj.scales": [9, 192], "self_attn.q_proj.g_idx": [576],
    "mlp.gate_proj.qweight": [72, 512], "mlp.up_proj.scales": [9, 512],
    "self_attn.o_proj.qweight": [72, 576], "self_attn.o_proj.g_idx": [576],  # act-order: all, to pick its groups
    "self_attn.o_proj.scales": [3, 576], "self_attn.o_proj.qzeros": [3, 72],  # its 3 of the 9 groups
    "mlp.down_proj.qweight": [192, 576], "mlp.down_proj.scales": [8, 576],
}


def test_a_rank_reads_only_its_part_of_each_quantized_tensor(quantized, monkeypatch):
    read = {}

    def recorded(f, name, shard, real=loader.read_tensor):
        read[name] = tensor = real(f, name, shard)
        return tensor

    monkeypatch.setattr(loader, "read_tensor", recorded)
    folder = quantized("gptq-g64-zeros-act-order")
    cfg = ModelConfig.from_folder(folder)
    shard = functools.partial(shard_model, layout=ShardLayout.of(cfg, 0, 3), group=None)
    model = loader.load_model(cfg, folder, "safetensors", torch.device("cpu"), torch.float32, shard=shard)
    assert {k: list(read[f"model.layers.0.{k}"].shape) for k in READ_BY_RANK_0} == READ_BY_RANK_0
    o_proj = model.model.layers[0].self_attn.o_proj
    assert o_proj.in_features == 192 and not o_proj.permuted  # its columns come in group order
    assert sorted(o_proj.input_columns.tolist()) == sorted(
        k for k, g in enumerate(read["model.layers.0.self_attn.o_proj.g_idx"].tolist()) if g < 3)


FP8_BLOCK, AWQ = QuantSpec(Layout.FP8_BLOCK, block=(64, 128)), QuantSpec(Layout.AWQ, group_size=64)
GPTQ, ACT_ORDER = QuantSpec(Layout.GPTQ, group_size=64), QuantSpec(Layout.GPTQ, group_size=64, desc_act=True)
# (spec, tensor, output rows or None, input columns or None) -> (dim, start, stop) read, None for all of it
PARTS = [
    (FP8_BLOCK, "weight", (128, 256), None, (0, 128, 256)),
    (FP8_BLOCK, "weight_scale_inv", (128, 256), None, (0, 2, 4)),
    (FP8_BLOCK, "weight_scale_inv", None, (256, 512), (1, 2, 4)),
    (QuantSpec(Layout.FP8_CHANNEL), "weight_scale", (64, 128), None, (0, 64, 128)),
    (QuantSpec(Layout.FP8_CHANNEL), "weight_scale", None, (64, 128), None),
    (QuantSpec(Layout.FP8_TENSOR), "weight_scale", (64, 128), None, None),
    (QuantSpec(Layout.FP8_CHANNEL, static_input_scale=True), "input_scale", None, (64, 128), None),
    (AWQ, "qweight", (64, 128), None, (1, 8, 16)),
    (AWQ, "qweight", None, (128, 256), (0, 128, 256)),
    (AWQ, "qzeros", None, (128, 256), (0, 2, 4)),
    (AWQ, "scales", (64, 128), None, (1, 64, 128)),
    (GPTQ, "qweight", (64, 128), None, (1, 64, 128)),
    (GPTQ, "qweight", None, (128, 256), (0, 16, 32)),
    (GPTQ, "g_idx", None, (128, 256), (0, 128, 256)),
    (GPTQ, "g_idx", (64, 128), None, None),
    (ACT_ORDER, "qweight", None, (128, 256), None),
    (ACT_ORDER, "g_idx", None, (128, 256), None),
    (ACT_ORDER, "scales", None, (128, 256), (0, 2, 4)),
]


@pytest.mark.parametrize("spec, kind, rows, cols, part", PARTS)
def test_each_layout_names_the_part_of_each_tensor_a_rank_reads(spec, kind, rows, cols, part):
    assert tensor_part(spec, kind, rows, cols) == part
