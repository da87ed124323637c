"""Build a model on its device and fill its weights from safetensors shards or at random."""

from __future__ import annotations

import contextlib
import json
from functools import partial
from pathlib import Path

import torch
from torch import nn

from hosttune_engine.errors import ModelLoadError
from hosttune_engine.layers.linear import MergedLinear
from hosttune_engine.layers.rotary import RotaryEmbedding
from hosttune_engine.model.llama import MODEL_CLASSES
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.model.shard import Shard, read_tensor
from hosttune_engine.quant.preflight import check_checkpoint
from hosttune_engine.quant.quant_linear import QuantLinear
from hosttune_engine.quant.spec import resolve_spec
from hosttune_engine.quant.transform import apply_quantization, check_loaded, quantize_loaded

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, shard=None, quantize=None) -> nn.Module:
    """An uninitialised model of `cfg`'s architecture, parameters already on `device` in `dtype`.

    `shard(model)`, for tensor parallelism, replaces layers by this rank's shards of them; `quantize(model,
    device)` swaps projections for quantized layers on the device. The model is built on the meta device
    first, so only the shards and the quantized weights ever take memory."""
    if shard is None and quantize is None:
        with _default_dtype(dtype), torch.device(device):
            return MODEL_CLASSES[cfg.architecture](cfg).eval().requires_grad_(False)
    with _default_dtype(dtype), torch.device("meta"):
        model = MODEL_CLASSES[cfg.architecture](cfg).eval().requires_grad_(False)
        if shard is not None:
            shard(model)
    if quantize is not None:
        quantize(model, device=device)
    return _materialize(model, device)


def _materialize(model: nn.Module, device: torch.device) -> nn.Module:
    """Storage on `device` for what is still on the meta device (contents unset; tied weights stay tied, the
    rotary tables are computed again, quantized layers already on the device are left as they are)."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is not None and t.is_meta:
                    if id(t) not in made:
                        empty = torch.empty_like(t, device=device)
                        made[id(t)] = nn.Parameter(empty, requires_grad=False) if isinstance(t, nn.Parameter) else empty
                    store[name] = made[id(t)]
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.fill_table()
    return model


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's files, each with a header safetensors reads (an interrupted download has none)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = _shard_names(index)
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ModelLoadError(f"{folder}: shards listed in {index.name} are missing: {', '.join(missing)}")
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights; use load_format='dummy' for random weights")
    for path in files:
        _check_header(path)
    return files


def _shard_names(index: Path) -> list[str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelLoadError(f"{index}: not a safetensors index ({type(e).__name__}: {e}); download it "
                             "again") from None


def _check_header(path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu"):
            pass
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({e}); download it again") from None


@torch.no_grad()
def load_safetensors(model: nn.Module, folder: Path) -> None:
    """Copy every checkpoint tensor into its parameter; fail on anything missing or misshapen."""
    from safetensors import safe_open

    params = dict(model.named_parameters())
    expected = expected_tensors(model)
    loaded: set[str] = set()
    unexpected: list[str] = []
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and model.config.tie_word_embeddings:
                    continue
                target = _load_one(model, params, name, partial(read_tensor, f, name), f"{path.name}:{name}")
                (loaded.add(name) if target else unexpected.append(name))
    if unexpected:
        raise ModelLoadError(f"{folder}: checkpoint tensors the model does not have: {', '.join(unexpected[:5])}")
    missing = sorted(expected - loaded)
    if missing:
        raise ModelLoadError(f"{folder}: weights missing from the checkpoint: {', '.join(missing[:5])}")


def _load_one(model: nn.Module, params: dict, name: str, read, source: str) -> bool:
    """`read(shard)`: the checkpoint tensor, or only the part a tensor-parallel rank holds (`tp_parts` of a
    fused layer, `tp_shards` of another: see `parallel.transform`)."""
    for part, (fused, shard) in model.packed_modules.items():
        if f".{part}." in name:
            module_name, kind = name.replace(f".{part}.", f".{fused}.").rsplit(".", 1)
            module = model.get_submodule(module_name)
            assert isinstance(module, (MergedLinear, QuantLinear))
            if isinstance(module, QuantLinear):
                part = _quantized_part(module, shard, kind)
            else:
                part = getattr(module, "tp_parts", {}).get(shard)
            module.load_shard(shard, kind, read(part), source)
            return True
    module_name, kind = name.rsplit(".", 1) if "." in name else ("", name)
    module = _submodule_or_none(model, module_name)
    if isinstance(module, QuantLinear):  # a quantized layer converts its checkpoint tensors itself
        module.load_shard(None, kind, read(_quantized_part(module, None, kind)), source)
        return True
    param = params.get(name)
    if param is None:
        return False
    tensor = read(getattr(module, "tp_shards", {}).get(kind))
    if param.shape != tensor.shape:
        raise ModelLoadError(f"{source}: shape {tuple(tensor.shape)} does not match the model's "
                             f"{tuple(param.shape)}; the checkpoint does not fit config.json")
    param.copy_(tensor)
    return True


def _quantized_part(module: QuantLinear, shard, kind: str) -> Shard | None:
    """The part of a quantized layer's checkpoint tensor this rank reads (its bias: as a plain layer's)."""
    if kind == "bias":
        return getattr(module, "tp_parts", {}).get(shard) or getattr(module, "tp_shards", {}).get("bias")
    part = module.checkpoint_part(shard, kind)
    return None if part is None else Shard(part[0], part[1], part[2], part[2] - part[1])


def _submodule_or_none(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def expected_tensors(model: nn.Module) -> set[str]:
    """Checkpoint names the model needs (fused parameters expanded to their parts)."""
    names = set()
    unpack = {fused: [] for fused, _ in model.packed_modules.values()}
    for part, (fused, _) in model.packed_modules.items():
        unpack[fused].append(part)
    for name, _ in model.named_parameters():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        fused = next((f for f in unpack if f".{f}." in name), None)
        names.update([name.replace(f".{fused}.", f".{p}.") for p in unpack[fused]] if fused else [name])
    return names


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights from config alone: N(0, 0.02) matrices, unit norms, zero biases.

    The projections back into the residual stream (o_proj, down_proj) are scaled
    by 1/sqrt(2 * layers), as in GPT-2, so each layer is a small update and a
    deep random model does not amplify rounding noise from layer to layer
    (used by benchmarks and the GPU checks).
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    residual_std = 0.02 / (2 * model.config.num_layers) ** 0.5
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            param.normal_(0.0, residual_std, generator=gen)
        else:
            param.normal_(0.0, 0.02, generator=gen)


def load_model(cfg: ModelConfig, folder: str | Path, load_format: str, device: torch.device,
               dtype: torch.dtype, seed: int = 0, quantization: str | None = None, shard=None) -> nn.Module:
    """A ready model: `load_format` "dummy" for random weights, else the folder's safetensors (with `shard`,
    this rank's part of them: see `build_model`).

    A quantized checkpoint (config.json's quantization_config) is checked against its safetensors
    headers before any weight is allocated; `quantization` "fp8" quantizes a bf16 checkpoint at load,
    and with dummy weights names any layout (quant/dummy_specs.py)."""
    spec = resolve_spec(cfg.quantization, quantization, load_format, str(folder))
    if spec is not None and load_format != "dummy":
        check_checkpoint(build_model(cfg, torch.device("meta"), dtype), spec, safetensors_files(Path(folder)))
    if shard is not None and spec is not None:
        shard = partial(shard, spec=spec)
    if load_format == "dummy":
        model = build_model(cfg, device, dtype, shard)
        init_dummy_weights(model, seed)
        if spec is not None:
            quantize_loaded(model, spec, dtype)
        return model
    quantize = None if spec is None else partial(apply_quantization, spec=spec, dtype=dtype)
    model = build_model(cfg, device, dtype, shard, quantize)
    load_safetensors(model, Path(folder))
    check_loaded(model)
    return model
