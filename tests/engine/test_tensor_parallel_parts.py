"""The parts of tensor parallelism that need no second process: which heads each rank holds, reading a
rank's shard from safetensors, the startup checks, and the step messages' mirrors."""

import dataclasses

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from hosttune_engine.config import EngineConfig
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.errors import ConfigError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.checks import check_gpu_count, check_shard_fits, shard_bytes
from hosttune_engine.parallel.layout import ShardLayout, check_divides_heads
from hosttune_engine.model.shard import Shard, read_tensor
from hosttune_engine.core.step_message import Mirrors, StepKind, step_message
from hosttune_engine.sampling import SamplingParams

from .conftest import DEVICE


def _config(tiny_models, **heads) -> ModelConfig:
    return dataclasses.replace(ModelConfig.from_folder(tiny_models["llama"]), **heads)


def test_kv_heads_are_split_when_there_are_enough_and_replicated_when_not(tiny_models):
    cfg = _config(tiny_models, num_heads=8, num_kv_heads=2)
    split = [ShardLayout.of(cfg, r, 2) for r in range(2)]
    assert [(s.first_head, s.num_heads, s.first_kv_head, s.num_kv_heads) for s in split] == [(0, 4, 0, 1), (4, 4, 1, 1)]
    replicated = [ShardLayout.of(cfg, r, 4) for r in range(4)]
    assert [(s.first_head, s.first_kv_head, s.num_kv_heads) for s in replicated] == [
        (0, 0, 1), (2, 0, 1), (4, 1, 1), (6, 1, 1)]  # query heads 0-3 read KV head 0, 4-7 head 1


def test_the_vocabulary_splits_in_padded_chunks(tiny_models):
    cfg = _config(tiny_models, vocab_size=10)
    layouts = [ShardLayout.of(cfg, r, 4) for r in range(4)]
    assert [(s.first_vocab_row, s.vocab_rows) for s in layouts] == [(0, 3), (3, 3), (6, 3), (9, 3)]


@pytest.mark.parametrize("heads,kv,tp,message", [
    (9, 3, 2, r"tensor_parallel_size=2 must divide the model's 9 attention heads \(3 KV heads\); use one of 1, 3, 9"),
    (12, 3, 4, r"tensor_parallel_size=4 and the model's 3 KV heads must divide one another \(12 attention heads\)"),
])
def test_head_counts_that_do_not_split_are_refused(tiny_models, heads, kv, tp, message):
    with pytest.raises(ConfigError, match=message):
        check_divides_heads(_config(tiny_models, num_heads=heads, num_kv_heads=kv, intermediate_size=288), tp)


def test_the_sizes_a_refusal_suggests_split_the_mlp_too(tiny_models):
    # The Qwen2.5-7B shape: 28 heads split 28 ways with their 4 KV heads, but 18944 MLP columns do not
    cfg = _config(tiny_models, num_heads=28, num_kv_heads=4, intermediate_size=18944)
    with pytest.raises(ConfigError, match=r"use one of 1, 2, 4$"):
        check_divides_heads(cfg, 3)
    with pytest.raises(ConfigError, match="must divide the MLP width 18944"):
        check_divides_heads(cfg, 28)


def test_tensor_parallel_size_must_be_positive():
    with pytest.raises(ConfigError, match="tensor_parallel_size must be >= 1"):
        EngineConfig(model="x", tensor_parallel_size=0)


def test_too_few_gpus_and_a_shard_too_big_are_one_line_errors(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=4 needs 4 GPUs, but this process sees 2 "
                                          r"\(CUDA_VISIBLE_DEVICES='0,1'\)"):
        check_gpu_count(4, 2)
    check_gpu_count(2, 2)
    with pytest.raises(ConfigError, match=r"rank 1's shard of the weights takes 30.0 GiB, more than "
                                          r"gpu_memory_utilization=0.9 of GPU 1's 24.0 GiB"):
        check_shard_fits(30 * 2**30, [80 * 2**30, 24 * 2**30], 0.9)
    check_shard_fits(30 * 2**30, [80 * 2**30, 80 * 2**30], 0.9)


def test_a_shard_of_the_weights_is_about_the_whole_over_the_ranks(tiny_models):
    cfg = ModelConfig.from_folder(tiny_models["qwen2"])
    whole = shard_bytes(cfg, 1, torch.float32)
    half = shard_bytes(cfg, 2, torch.float32)
    assert whole / 2 <= half < whole / 2 * 1.05  # norms are replicated, nothing else is


def test_a_rank_reads_only_its_rows_or_columns(tmp_path):
    weight = torch.arange(5 * 4, dtype=torch.float32).view(5, 4)
    save_file({"w": weight}, str(tmp_path / "t.safetensors"))
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt") as f:
        assert torch.equal(read_tensor(f, "w", None), weight)
        assert torch.equal(read_tensor(f, "w", Shard(0, 2, 4, 2)), weight[2:4])
        assert torch.equal(read_tensor(f, "w", Shard(1, 1, 3, 2)), weight[:, 1:3])
        padded = read_tensor(f, "w", Shard(0, 3, 6, 3))  # the vocabulary's last chunk, past its end
        assert torch.equal(padded[:2], weight[3:]) and not padded[2].any()
        assert torch.equal(read_tensor(f, "w", Shard(0, 0, 0, 5)), torch.zeros(5, 4))


def test_mirrors_follow_rank_zeros_sequences():
    seq = Sequence("r", [5, 6, 7, 8], SamplingParams())
    seq.block_table, seq.num_computed_tokens = [3, 9], 0
    mirrors = Mirrors()
    (mirror,) = mirrors.update(step_message(StepKind.EAGER, SchedulerOutput([seq], [3]))).seqs
    assert mirror.token_ids[:3] == [5, 6, 7] and mirror.block_table == [3, 9] and mirror.num_tokens == 4
    seq.num_computed_tokens = 3
    seq.append_token(11)
    (again,) = mirrors.update(step_message(StepKind.EAGER, SchedulerOutput([seq], [2]))).seqs
    assert again is mirror and again.token_ids == [5, 6, 7, 8, 11] and again.num_computed_tokens == 3
    fed = mirrors.update(step_message(StepKind.DECODE_GRAPH, SchedulerOutput([seq], [1]), feed=[0])).seqs[0]
    assert fed is mirror and fed.num_tokens == 5
    mirrors.update(step_message(StepKind.EAGER, SchedulerOutput(), released=("r",)))
    assert mirrors.seqs == {}


def test_serve_takes_the_tensor_parallel_size():
    from hosttune_engine.server.cli import _parser, config_from_args

    args = _parser().parse_args(["serve", "--model", "/m", "--tensor-parallel-size", "4"])
    assert config_from_args(args).engine.tensor_parallel_size == 4


def test_an_input_gather_computes_the_prologue_it_is_handed_first():
    """A row-parallel act-order layer gathers its input from every rank: a SwiGLU handed to it as its prologue
    (by the fused module, at one row) runs on this rank's columns first, and the layer gets plain rows."""
    from types import SimpleNamespace

    from hosttune_engine.kernels.swiglu import swiglu
    from hosttune_engine.layers.prologue import SWIGLU
    from hosttune_engine.parallel.quant_split import _gather_input

    columns = torch.tensor([3, 0, 1], device=DEVICE)
    one_rank, layer = SimpleNamespace(gather_columns=lambda x: x), SimpleNamespace(input_columns=columns)
    gate_up = torch.randn(1, 8, device=DEVICE)
    args, kwargs = _gather_input(one_rank, layer, (gate_up,), {"prologue": SWIGLU})
    assert kwargs == {} and torch.equal(args[0], swiglu(gate_up)[:, [3, 0, 1]])
