"""A tensor-parallel rank's kernel plan: the tuned-table entries it reads are those of its own shards' shapes
(column-parallel qkv and gate_up: N / TP rows; row-parallel o and down: K / TP columns; the LM head: its padded
vocabulary rows), and its attention's those of its own heads."""

import dataclasses
import json
from functools import partial

import pytest
import torch

from hosttune_engine.model.loader import build_model
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.layout import ShardLayout
from hosttune_engine.parallel.transform import shard_model
from hosttune_engine.plan.gpus import named_gpu
from hosttune_engine.plan.kinds import Op, Reason
from hosttune_engine.planner.build import PlanInputs, build_plan
from hosttune_engine.planner.prepare import plan_for_model, table_and_name
from hosttune_engine.quant.dummy_specs import dummy_spec
from hosttune_engine.quant.transform import apply_quantization
from hosttune_engine.server.cli import main

from .test_kernel_plan import QWEN7B, no_user_tables  # noqa: F401  (a fixture: no tuned tables but the shipped one)

# Qwen2.5-7B's projections (N x K), whole and on each of two ranks
WHOLE = {Op.QKV: "4608x3584", Op.O: "3584x3584", Op.GATE_UP: "37888x3584", Op.DOWN: "3584x18944"}
RANK_OF_2 = {Op.QKV: "2304x3584", Op.O: "3584x1792", Op.GATE_UP: "18944x3584", Op.DOWN: "3584x9472"}


def _entries(shapes: dict, block_n: int) -> dict:
    return {f"bfloat16-le1-{shape}": {"BLOCK_N": block_n} for shape in shapes.values()}


# the whole model's shapes tuned to BLOCK_N 8, a rank's of two to 16
TABLE = {"int4_gemv": {**_entries(WHOLE, 8), **_entries(RANK_OF_2, 16)}}


def test_a_sharded_model_reads_the_entries_of_its_ranks_shapes(no_user_tables):
    """The plan the model runner prepares a rank's model with (`plan_for_model` of its sharded model)."""
    cfg, spec = ModelConfig.from_folder(QWEN7B), dummy_spec("awq")
    shard = partial(shard_model, layout=ShardLayout.of(cfg, 0, 2), group=None, spec=spec)
    quantize = partial(apply_quantization, spec=spec, dtype=torch.bfloat16)
    model = build_model(cfg, torch.device("meta"), torch.bfloat16, shard, quantize)
    plan = plan_for_model(model, named_gpu("NVIDIA H200"), table=TABLE)
    for op, shape in RANK_OF_2.items():
        one = plan.choice(op, 1)
        assert (one.reason, one.entry, one.config.block_n) == (Reason.TUNED_SHAPE, f"int4_gemv bfloat16-le1-{shape}",
                                                                 16), op



def test_a_rank_whose_kv_head_is_replicated_plans_the_attention_of_its_own_heads(no_user_tables):
    """28 query heads over 2 KV heads at TP=4: a rank holds 7 query heads and 1 KV head, so its decode attention
    reads the g7 entries (Qwen2.5-7B's, shipped for the H200), not the whole model's g14."""
    cfg = dataclasses.replace(ModelConfig.from_folder(QWEN7B), num_kv_heads=2)
    inputs = PlanInputs(cfg, named_gpu("NVIDIA H200"), torch.bfloat16, shard=ShardLayout.of(cfg, 0, 4))
    one = build_plan(inputs, *table_and_name(inputs.gpu)).choice(Op.ATTENTION, 1)
    assert (one.reason, one.entry) == (Reason.TUNED_BUCKET, "decode_attention bfloat16-d128-g7-paged16-le1")


def test_the_plan_command_prints_the_plan_of_one_rank_of_serves_tensor_parallel_size(no_user_tables, capsys):
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200", "--quantization", "awq",
          "--tensor-parallel-size", "2"])
    out = capsys.readouterr().out
    assert ("tensor parallel over 2 ranks: one rank's shards below, 14/2 heads, intermediate 9472, vocab rows 76032"
            in out)
    for op, shape in RANK_OF_2.items():
        assert f"{op.value}: weight {shape} (N x K)" in out
    assert not [shape for shape in WHOLE.values() if shape in out]  # no entry of the whole model's shapes is read
    assert "lm_head: weight 76032x3584 (N x K)" in out


@pytest.mark.parametrize("size, message", [
    ("0", "tensor_parallel_size must be >= 1, got 0"),
    ("3", "tensor_parallel_size=3 must divide the model's 28 attention heads (4 KV heads); use one of 1, 2, 4"),
])
def test_the_plan_command_refuses_a_tensor_parallel_size_serve_refuses(no_user_tables, capsys, size, message):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200", "--tensor-parallel-size", size])
    assert exit_.value.code == 2 and capsys.readouterr().err == f"hosttune-engine: error: {message}\n"


def test_a_tensor_parallel_tune_times_and_keys_one_ranks_shards(no_user_tables, monkeypatch):
    """At TP=4 over 2 KV heads a rank holds 7 query heads and 1 KV head: tune times its shards' shapes and its
    attention, under the keys its plan reads (the sweeps stand in: the shapes and heads are what is checked)."""
    from types import SimpleNamespace

    from hosttune_engine.tuner import run

    monkeypatch.setattr(run.cases, "quant_gemv", lambda kind, s, dtype, timer: s.name)
    monkeypatch.setattr(run.cases, "gemm", lambda kind, s, m, dtype, timer: f"{s.name} m={m}")
    monkeypatch.setattr(run.cases, "attention", lambda batch, ctx, hq, hkv, *rest: f"attention {hq}/{hkv}")
    timed = []

    def sweep(self, kernel, default, case_list, rows=1):
        timed.extend(case_list)
        return SimpleNamespace(best=SimpleNamespace(config={"BLOCK_N": 16}), tried=())

    monkeypatch.setattr(run.Tuning, "run", sweep)
    cfg = dataclasses.replace(ModelConfig.from_folder(QWEN7B), num_kv_heads=2)
    inputs = PlanInputs(cfg, named_gpu("NVIDIA L40S"), torch.bfloat16, dummy_spec("awq"),
                        shard=ShardLayout.of(cfg, 0, 4))
    done = run.tune_model(inputs, budget_s=600)
    rank = ["qkv_proj 1152x3584", "o_proj 3584x896", "gate_up_proj 9472x3584", "down_proj 3584x4736"]
    assert timed[:4] == rank and timed[4:6] == ["attention 7/1"] * 2
    assert set(done.table["int4_gemv"]) == {f"bfloat16-le1-{s.split()[1]}" for s in rank}
    assert set(done.table["decode_attention"]) == {"bfloat16-d128-g7-paged16-le1", "bfloat16-d128-g7-paged16-le64"}


def test_tune_takes_serves_tensor_parallel_size_and_tunes_its_shards_apart(no_user_tables, monkeypatch, capsys):
    from hosttune_engine.tuner import command
    from hosttune_engine.tuner.run import Tuning

    from .test_tuner import _an_l40s

    seen = []
    _an_l40s(monkeypatch)
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: seen.append(inputs) or Tuning(inputs, None, None))
    main(["tune", "--model", str(QWEN7B), "--budget-s", "1", "--tensor-parallel-size", "2"])
    assert [inputs.shape(Op.GATE_UP) for inputs in seen] == [(18944, 3584)]
    capsys.readouterr()
    main(["tune", "--model", str(QWEN7B), "--tensor-parallel-size", "2", "--if-missing"])
    assert "has a table tuned for bf16 weights, 2-way tensor-parallel shards on this driver" in capsys.readouterr().out
    main(["tune", "--model", str(QWEN7B), "--budget-s", "1", "--if-missing"])  # the whole model's are not tuned yet
    assert [inputs.shape(Op.GATE_UP) for inputs in seen] == [(18944, 3584), (37888, 3584)]
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--tensor-parallel-size", "3"])
    assert exit_.value.code == 2 and "tensor_parallel_size=3 must divide" in capsys.readouterr().err


def _small_llama(tmp_path, **fields) -> str:
    """A config.json alone (plan and tune read no weights): 2 layers, 8 heads, 8 KV heads, MLP 128, unless `fields`."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 1000,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", **fields}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


@pytest.mark.parametrize("fields, size, message", [
    ({"num_attention_heads": 12, "num_key_value_heads": 3, "hidden_size": 96, "intermediate_size": 96}, "4",
     "tensor_parallel_size=4 and the model's 3 KV heads must divide one another (12 attention heads); "
     "use one of 1, 3, 6, 12"),
    ({"intermediate_size": 100}, "8", "tensor_parallel_size=8 must divide the MLP width 100; use one of 1, 2, 4"),
], ids=["kv-heads", "mlp"])
@pytest.mark.parametrize("command", ["plan", "tune"])
def test_plan_and_tune_refuse_a_size_the_heads_or_mlp_do_not_split_in_one_line(tmp_path, capsys, command, fields,
                                                                              size, message):
    """tune refuses it before it looks for a GPU, as it does a bad model folder: this machine has none."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--model", _small_llama(tmp_path, **fields), "--tensor-parallel-size", size])
    assert exit_.value.code == 2 and capsys.readouterr().err == f"hosttune-engine: error: {message}\n"
