"""Quantized checkpoints the engine cannot serve are refused with one error that names what and where,
before any weight is allocated on the device."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hosttune_engine import Engine, EngineConfig
from hosttune_engine.errors import ConfigError, ModelLoadError, QuantizationError
from hosttune_engine.model import loader

from hosttune_engine.quant.fp8_linear import Fp8Linear
from hosttune_engine.checkpoint.writer import write_quantized

from .quant_checkpoints import SPECS, write

Q_PROJ = "model.layers.0.self_attn.q_proj"


@pytest.fixture
def no_device_weights(monkeypatch):
    """Fail if the model is built anywhere but the meta device (where the checks build it)."""
    real = loader.build_model

    def build(cfg, device, dtype):
        if torch.device(device).type != "meta":
            raise AssertionError("weights were allocated before the checkpoint was refused")
        return real(cfg, device, dtype)

    monkeypatch.setattr(loader, "build_model", build)


def _written(tiny_models, tmp_path, name):
    return write(tiny_models["llama"], tmp_path / name, name)


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"].update(changes)
    path.write_text(json.dumps(config))


def _edit_tensors(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _load(folder, **kw):
    return Engine(EngineConfig(model=str(folder), dtype="float32", device="cpu", num_kv_blocks=16, **kw))


@pytest.mark.parametrize("name, changes, message", [
    ("awq-g64", {"quant_method": "bitsandbytes"}, "quantization method 'bitsandbytes' is not supported"),
    ("awq-g64", {"bits": 3}, "3-bit AWQ is not supported"),
    ("gptq-g64-sym", {"bits": 8}, "8-bit GPTQ is not supported"),
    ("awq-g64", {"version": "gemv"}, "AWQ version 'gemv' is not supported"),
    ("fp8-block", {"activation_scheme": "static"}, "activation_scheme 'static' is not supported"),
    ("fp8-block", {"weight_block_size": None}, "weight_block_size must be two positive ints"),
    ("gptq-g64-sym", {"lm_head": True}, "a quantized lm_head is not supported"),
    ("awq-g64", {"group_size": 48}, f"{Q_PROJ}: group size 48 does not divide its input width 128"),
    ("awq-g64", {"group_size": 4}, f"{Q_PROJ}: group size 4 is not a multiple of 8"),
])
def test_unsupported_configs_are_refused(tiny_models, tmp_path, no_device_weights, name, changes, message):
    folder = _written(tiny_models, tmp_path, name)
    _edit_config(folder, **changes)
    with pytest.raises(QuantizationError, match=message.replace("(", r"\(")):
        _load(folder)


def test_8_bit_compressed_tensors_int_weights_are_refused(tiny_models, tmp_path, no_device_weights):
    folder = _written(tiny_models, tmp_path, "fp8-channel")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "int"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizationError, match="8-bit int weights are not supported"):
        _load(folder)


@pytest.mark.parametrize("name, tensor, message", [
    ("fp8-block", "weight_scale_inv", "weight_scale_inv is missing"),
    ("fp8-channel", "weight_scale", "weight_scale is missing"),
    ("awq-g64", "scales", "scales is missing"),
    ("gptq-g64-sym", "g_idx", "g_idx is missing"),
])
def test_missing_scales_are_refused(tiny_models, tmp_path, no_device_weights, name, tensor, message):
    folder = _written(tiny_models, tmp_path, name)
    _edit_tensors(folder, lambda t: t.pop(f"{Q_PROJ}.{tensor}"))
    with pytest.raises(QuantizationError, match=f"{Q_PROJ}.{message}"):
        _load(folder)


@pytest.mark.parametrize("name, tensor, bad, message", [
    ("fp8-block", "weight_scale_inv", torch.ones(2, 2), r"has shape \[2, 2\]; the layout and config.json need \[1, 1\]"),
    ("awq-g64", "qzeros", torch.zeros(4, 16, dtype=torch.int32), r"has shape \[4, 16\]"),
    ("gptq-g64-sym", "qweight", torch.zeros(16, 128, dtype=torch.int64), "has dtype int64; the layout stores int32"),
    ("fp8-channel", "weight", torch.zeros(128, 128, dtype=torch.bfloat16), "has dtype bfloat16"),
])
def test_disagreeing_tensors_are_refused(tiny_models, tmp_path, no_device_weights, name, tensor, bad, message):
    folder = _written(tiny_models, tmp_path, name)
    _edit_tensors(folder, lambda t: t.update({f"{Q_PROJ}.{tensor}": bad}))
    with pytest.raises(QuantizationError, match=message):
        _load(folder)


def test_fused_projections_must_agree_on_act_order_groups(tiny_models, tmp_path):
    folder = _written(tiny_models, tmp_path, "gptq-g64-zeros-act-order")
    k_proj = "model.layers.0.self_attn.k_proj.g_idx"
    _edit_tensors(folder, lambda t: t.update({k_proj: t[k_proj].flip(0).contiguous()}))
    with pytest.raises(QuantizationError, match="its g_idx differs from the other projections fused with it"):
        _load(folder)


def test_partly_quantized_fused_projection_is_refused(tiny_models, tmp_path, no_device_weights):
    folder = _written(tiny_models, tmp_path, "fp8-channel")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", "re:.*k_proj"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizationError, match="quantizes some of"):
        _load(folder)


def test_quantization_option_only_where_it_means_something(tiny_models, tmp_path):
    folder = _written(tiny_models, tmp_path, "awq-g64")
    with pytest.raises(ConfigError, match="is already quantized"):
        _load(folder, quantization="fp8")
    with pytest.raises(ConfigError, match="for dummy weights only"):
        EngineConfig(model=str(tiny_models["llama"]), quantization="awq")
    with pytest.raises(ConfigError, match="quantization must be one of"):
        EngineConfig(model=str(tiny_models["llama"]), quantization="int3")


def test_tensors_the_model_lacks_are_refused(tiny_models, tmp_path):
    folder = _written(tiny_models, tmp_path, "fp8-channel")
    _edit_tensors(folder, lambda t: t.update({"model.layers.0.extra.weight": torch.ones(2)}))
    with pytest.raises(ModelLoadError, match="checkpoint tensors the model does not have"):
        _load(folder)


def test_layers_the_checkpoint_ignores_stay_plain(tiny_models, tmp_path):
    spec = dataclasses.replace(SPECS["fp8-channel"], ignore=("lm_head", "re:.*down_proj"))
    folder = write_quantized(tiny_models["llama"], tmp_path / "q", spec, torch.bfloat16)
    mlp = _load(folder).runner.model.model.layers[0].mlp
    assert isinstance(mlp.gate_up_proj, Fp8Linear)
    assert isinstance(mlp.down_proj, torch.nn.Linear) and not isinstance(mlp.down_proj, Fp8Linear)


def test_act_order_groups_of_unequal_sizes_are_refused(tiny_models, tmp_path):
    """The engine sorts act-order columns into plain groups at load, which needs group_size columns in each."""
    folder = _written(tiny_models, tmp_path, "gptq-g64-zeros-act-order")

    def uneven(t):
        for proj in ("q_proj", "k_proj", "v_proj"):
            g_idx = t[f"model.layers.0.self_attn.{proj}.g_idx"]
            g_idx[g_idx == 1] = 0  # group 0 gets two groups' columns, group 1 none
    _edit_tensors(folder, uneven)
    with pytest.raises(QuantizationError, match="g_idx must give every group exactly 64 columns"):
        _load(folder)
