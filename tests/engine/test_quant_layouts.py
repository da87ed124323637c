"""The writer writes each public quantized layout exactly (names, dtypes, shapes, config.json), and the
engine reads each one: its logits equal transformers' on the same weights dequantized in fp32."""

import dataclasses
import json
import os
import re
import shutil
import time

import pytest
import torch
from safetensors import safe_open

from hosttune_engine import Engine, EngineConfig
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.quant.int4_packing import AWQ_ORDER, pack_int4, unpack_int4
from hosttune_engine.checkpoint.writer import write_quantized
from hosttune_engine.sampling import SamplingParams

from .oracle import hf_logits, prompt_ids
from .quant_checkpoints import SPECS, STALE_S, drop_stale_versions, dtype_of, write
from .quant_reference import dequantize_folder

F8, BF16, F16, F32, I32 = "F8_E4M3", "BF16", "F16", "F32", "I32"
LAYER = "model.layers.0."
# The tiny Llama: hidden 128, intermediate 256, 4 query heads and 1 key/value head of 32.
SHAPES = {"self_attn.q_proj": (128, 128), "self_attn.k_proj": (32, 128), "self_attn.v_proj": (32, 128),
          "self_attn.o_proj": (128, 128), "mlp.gate_proj": (256, 128), "mlp.up_proj": (256, 128),
          "mlp.down_proj": (128, 256)}
NORMS = {"input_layernorm.weight", "post_attention_layernorm.weight"}


def _fp8(scale_name, scale_dtype, scale_shape):
    out = {}
    for m, (n, k) in SHAPES.items():
        out[f"{m}.weight"] = (F8, [n, k])
        out[f"{m}.{scale_name}"] = (scale_dtype, scale_shape(n, k))
    return out


def _awq():  # qweight [K, N/8], qzeros [K/64, N/8], scales [K/64, N]
    return {f"{m}.{s}": v for m, (n, k) in SHAPES.items() for s, v in
            (("qweight", (I32, [k, n // 8])), ("qzeros", (I32, [k // 64, n // 8])), ("scales", (F16, [k // 64, n])))}


def _gptq():  # qweight [K/8, N], qzeros [K/64, N/8], scales [K/64, N], g_idx [K]
    return {f"{m}.{s}": v for m, (n, k) in SHAPES.items() for s, v in
            (("qweight", (I32, [k // 8, n])), ("qzeros", (I32, [k // 64, n // 8])), ("scales", (F16, [k // 64, n])),
             ("g_idx", (I32, [k])))}


EXPECTED_LAYER0 = {
    "fp8-block": _fp8("weight_scale_inv", F32, lambda n, k: [-(-n // 128), -(-k // 128)]),
    "fp8-channel": _fp8("weight_scale", BF16, lambda n, k: [n, 1]),
    "fp8-tensor": _fp8("weight_scale", BF16, lambda n, k: [1]),
    "awq-g64": _awq(),
    "gptq-g64-sym": _gptq(),
    "gptq-g64-zeros-act-order": _gptq(),
}
EXPECTED_CONFIG = {
    "fp8-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]},
    "awq-g64": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm", "zero_point": True,
                "modules_to_not_convert": None},
    "gptq-g64-zeros-act-order": {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True,
                                 "sym": False, "damp_percent": 0.01, "static_groups": False,
                                 "true_sequential": True, "lm_head": False, "checkpoint_format": "gptq"},
}


def _header(folder):
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {name: (f.get_slice(name).get_dtype(), f.get_slice(name).get_shape()) for name in f.keys()}


@pytest.fixture(scope="module")
def written(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    return {name: write(tiny_models["llama"], root / name, name) for name in SPECS}


@pytest.mark.parametrize("name", list(SPECS))
def test_writer_matches_the_public_layout(written, name):
    header = _header(written[name])
    layer0 = {n.removeprefix(LAYER): v for n, v in header.items() if n.startswith(LAYER)}
    want = dict(EXPECTED_LAYER0[name])
    norm_dtype = BF16 if name.startswith("fp8") else F16
    want.update({n: (norm_dtype, [128]) for n in NORMS})
    assert layer0 == want
    assert header["model.embed_tokens.weight"][0] == norm_dtype


def test_fp8_compressed_tensors_config_is_llm_compressors():
    from hosttune_engine.quant.layouts import quantization_config

    qc = quantization_config(SPECS["fp8-channel"])
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
    assert qc["ignore"] == ["lm_head"] and qc["quantization_status"] == "compressed"
    group = qc["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    assert {k: group["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric", "dynamic")} == \
        {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    assert {k: group["input_activations"][k] for k in ("num_bits", "type", "strategy", "dynamic")} == \
        {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}


@pytest.mark.parametrize("name", sorted(EXPECTED_CONFIG))
def test_config_json_announces_the_layout(written, name):
    config = json.loads((written[name] / "config.json").read_text())
    assert config["quantization_config"] == EXPECTED_CONFIG[name]


def test_packing_orders():
    columns = torch.arange(8, dtype=torch.uint8).reshape(1, 8)
    assert pack_int4(columns, 1).item() == 0x76543210  # GPTQ: value i at bits 4i
    assert pack_int4(columns, 1, AWQ_ORDER).item() == 0x75316420  # AWQ: nibble i holds column AWQ_ORDER[i]
    values = torch.randint(0, 16, (16, 24), dtype=torch.uint8)
    for dim in (0, 1):
        assert torch.equal(unpack_int4(pack_int4(values, dim, AWQ_ORDER), dim, AWQ_ORDER), values)


def _engine_logits(folder, ids, **kw):
    eng = Engine(EngineConfig(model=str(folder), dtype="float32", device="cpu", num_kv_blocks=64, **kw))
    seq = Sequence("x", ids, SamplingParams(temperature=0))
    eng.block_manager.allocate(seq, len(ids))
    return eng.runner.prefill_logits(seq).cpu()


@pytest.mark.parametrize("model", ["llama", "qwen2"])
@pytest.mark.parametrize("name", list(SPECS))
def test_engine_reads_each_layout(tiny_models, tmp_path, model, name):
    spec = SPECS[name]
    if model == "qwen2" and not spec.layout.is_fp8:  # the tiny Qwen2 (q/k/v biases) is 112 wide: groups of 16
        spec = dataclasses.replace(spec, group_size=16)
    quantized = write_quantized(tiny_models[model], tmp_path / "q", spec, dtype_of(spec))
    plain = dequantize_folder(quantized, tmp_path / "plain")
    ids = prompt_ids(40, seed=3)
    torch.testing.assert_close(_engine_logits(quantized, ids), hf_logits(plain, ids), atol=1e-4, rtol=0)


def _script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "engine" / "scripts" / "quantize_checkpoint.py"
    spec = importlib.util.spec_from_file_location("quantize_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("args", [["--layout", "fp8-block"], ["--layout", "fp8-tensor"],
                                  ["--layout", "gptq", "--group-size", "32", "--sym", "--desc-act"],
                                  ["--layout", "awq", "--group-size", "64", "--calibration-text", "TEXT"]])
def test_script_writes_checkpoints_the_engine_reads(tiny_models, tmp_path, args):
    text = tmp_path / "calibration.txt"
    text.write_text("The engine reads a prompt and writes tokens, one step at a time. " * 20)
    out = tmp_path / "out"
    argv = ["--model", str(tiny_models["llama"]), "--out", str(out), *[str(text) if a == "TEXT" else a for a in args]]
    assert _script().main(argv) == 0
    plain = dequantize_folder(out, tmp_path / "plain")
    ids = prompt_ids(20, seed=4)
    torch.testing.assert_close(_engine_logits(out, ids), hf_logits(plain, ids), atol=1e-4, rtol=0)


def test_script_reports_a_width_the_group_size_does_not_divide(tiny_models, tmp_path, capsys):
    argv = ["--model", str(tiny_models["llama"]), "--out", str(tmp_path / "out"), "--layout", "awq", "--group-size", "48"]
    assert _script().main(argv) == 2
    assert "group size 48 does not divide its input width 128" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_script_refuses_an_out_folder_holding_files_and_a_quantized_source(tiny_models, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model-00001-of-00002.safetensors").write_bytes(b"")
    cases = [(["--model", str(tiny_models["llama"]), "--out", str(taken)], "--out .*taken already holds files"),
             (["--model", str(tiny_models["llama"]), "--out", str(tiny_models["llama"])], "already holds files"),
             (["--model", str(tiny_models["llama"]), "--out", "/proc/q"], "--out /proc/q: cannot create it"),
             (["--model", str(tiny_models["llama"]), "--out", str(tmp_path / "c"), "--calibration-text",
               str(tmp_path / "none.txt")], "--calibration-text .*none.txt: cannot read it")]
    for argv, message in cases:
        assert _script().main([*argv, "--layout", "awq"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(message, err), err
    assert list(taken.iterdir()) == [taken / "model-00001-of-00002.safetensors"]
    fp8 = tmp_path / "fp8"
    assert _script().main(["--model", str(tiny_models["llama"]), "--out", str(fp8), "--layout", "fp8-tensor"]) == 0
    assert _script().main(["--model", str(fp8), "--out", str(tmp_path / "again"), "--layout", "awq"]) == 2
    assert "is already quantized (fp8-tensor); give the plain checkpoint" in capsys.readouterr().err
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_models["qwen2"], truncated)
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:4096])
    assert _script().main(["--model", str(truncated), "--out", str(tmp_path / "t"), "--layout", "awq"]) == 2
    assert "model.safetensors: not a readable safetensors file" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ("drop", "weights missing from the checkpoint: model.layers.0.mlp.down_proj.weight"),
    ("reshape", "model.layers.0.mlp.down_proj.weight: shape (3, 3) does not match the model's (128, 256); the "
                "checkpoint does not fit config.json"),
    ("reshape norm", "model.norm.weight: shape (3, 3) does not match the model's (128,)"),
    ("add", "checkpoint tensors the model does not have: model.layers.9.mlp.down_proj.weight"),
])
@pytest.mark.parametrize("layout", ["fp8-tensor", "gptq"])
def test_script_refuses_a_checkpoint_that_does_not_fit_its_config(tiny_models, tmp_path, capsys, change, message,
                                                                  layout):
    # as the engine's loader would refuse it, before anything is quantized or written
    from safetensors.torch import load_file, save_file

    source = tmp_path / "source"
    shutil.copytree(tiny_models["llama"], source)
    shard = source / "model-00002-of-00002.safetensors"
    tensors = load_file(shard)
    name = "model.norm.weight" if change == "reshape norm" else "model.layers.0.mlp.down_proj.weight"
    if change == "drop":
        del tensors[name]
    elif change == "add":
        tensors["model.layers.9.mlp.down_proj.weight"] = tensors[name].clone()
    else:
        tensors[name] = torch.zeros(3, 3)
    save_file(tensors, shard, metadata={"format": "pt"})
    argv = ["--model", str(source), "--out", str(tmp_path / "out"), "--layout", layout]
    assert _script().main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quantize_checkpoint: error: {source}: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["", " \n\t\n"])
def test_script_refuses_calibration_text_without_text(tiny_models, tmp_path, capsys, text):
    # else the scale search it asks for would be skipped and round-to-nearest written in its place
    empty = tmp_path / "empty.txt"
    empty.write_text(text)
    argv = ["--model", str(tiny_models["llama"]), "--out", str(tmp_path / "o"), "--layout", "awq", "--group-size",
            "64", "--calibration-text", str(empty)]
    assert _script().main(argv) == 2
    assert capsys.readouterr().err == (f"quantize_checkpoint: error: --calibration-text {empty} holds no text; give "
                                       "a file of representative text (its first 512 tokens are used)\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option", ["--group-size", "--block"])
def test_script_refuses_a_size_below_one_as_bad_usage(tiny_models, tmp_path, capsys, option):
    with pytest.raises(SystemExit) as exit_:
        _script().main(["--model", str(tiny_models["llama"]), "--out", str(tmp_path / "o"), "--layout", "fp8-block",
                        option, "0"])
    assert exit_.value.code == 2 and f"argument {option}: '0': give a whole number > 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("layout, option, applies_to", [
    ("fp8-channel", ["--block", "64"], "fp8-block"), ("fp8-block", ["--group-size", "64"], "awq or gptq"),
    ("awq", ["--sym"], "gptq"), ("awq", ["--desc-act"], "gptq"), ("fp8-tensor", ["--calibration-text", "x"], "awq or gptq"),
])
def test_script_refuses_an_option_its_layout_would_ignore(tiny_models, tmp_path, capsys, layout, option, applies_to):
    # ignored, it would write a checkpoint other than the one asked for (AWQ has zero points whatever --sym says)
    argv = ["--model", str(tiny_models["llama"]), "--out", str(tmp_path / "o"), "--layout", layout, *option]
    assert _script().main(argv) == 2
    assert capsys.readouterr().err == (f"quantize_checkpoint: error: {option[0]} applies to --layout {applies_to}, "
                                       f"not {layout}\n")
    assert not (tmp_path / "o").exists()


def test_cached_checkpoints_of_old_writer_versions_are_dropped_after_a_day(tmp_path):
    current, recent, old = (tmp_path / f"quant-{name}" for name in ("now", "recent", "old"))
    for folder in (current, recent, old):
        (folder / "x").mkdir(parents=True)
    day_ago = time.time() - STALE_S - 60
    os.utime(old, (day_ago, day_ago))
    (tmp_path / "smollm2").mkdir()
    os.utime(tmp_path / "smollm2", (day_ago, day_ago))
    drop_stale_versions(current)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quant-now", "quant-recent", "smollm2"]
