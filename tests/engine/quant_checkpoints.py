"""Quantized checkpoints written by the engine's writer, for the tests, cached by the writer's source."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import time
from pathlib import Path

import torch

from hosttune_engine.quant.spec import Layout, QuantSpec
from hosttune_engine.checkpoint.writer import write_quantized

from .quant_reference import dequantize_folder
from .smollm2 import CACHE

ENGINE_DIR = Path(__file__).resolve().parents[2] / "engine" / "hosttune_engine"

SPECS = {
    "fp8-block": QuantSpec(Layout.FP8_BLOCK, block=(128, 128), ignore=("lm_head",)),
    "fp8-channel": QuantSpec(Layout.FP8_CHANNEL, fp8_activations=True, ignore=("lm_head",)),  # FP8_DYNAMIC
    "fp8-tensor": QuantSpec(Layout.FP8_TENSOR, fp8_activations=True, ignore=("lm_head",)),
    "awq-g64": QuantSpec(Layout.AWQ, group_size=64),
    "gptq-g64-sym": QuantSpec(Layout.GPTQ, group_size=64, zero_point=False, zero_offset=1),
    "gptq-g64-zeros-act-order": QuantSpec(Layout.GPTQ, group_size=64, desc_act=True, zero_offset=1),
}

# Blocks that split at tensor_parallel_size 3 on SmolLM2 (192 query rows, 64 KV rows and 192 o_proj input
# columns a rank), where 128 do not.
SPLIT_SPECS = {"fp8-block-64": QuantSpec(Layout.FP8_BLOCK, block=(64, 64), ignore=("lm_head",))}


# Written after the activation-aware scale search, calibrated on other text than the accuracy tests read.
SEARCHED = {"awq-g64-search": SPECS["awq-g64"]}
# Calibration tokens for the search: on this model 128 give the same gain over round to nearest as 512
# (KL to the unquantized model 0.49 and 0.52, round to nearest 0.90) at a third of the writing time.
CALIBRATION_TOKENS = 128


def calibration_text() -> str:
    """A BSD licence an installed package ships (the accuracy tests read an Apache licence)."""
    import importlib.metadata

    for package in ("numpy", "jinja2", "markupsafe", "click"):
        for f in importlib.metadata.distribution(package).files or ():
            if f.name.startswith(("LICENSE", "LICENCE")) and "Redistribution" in (text := f.read_text()):
                return text
    raise RuntimeError("no installed package ships a BSD licence file")


def dtype_of(spec: QuantSpec) -> torch.dtype:
    return torch.bfloat16 if spec.layout.is_fp8 else torch.float16


def writer_version() -> str:
    """A hash of the writer's code: a cached checkpoint is rewritten when the code that wrote it changes."""
    h = hashlib.sha256()
    for name in ("quant/quantize.py", "quant/int4_packing.py", "quant/layouts.py", "quant/spec.py",
                 "checkpoint/writer.py", "checkpoint/scale_search.py"):
        h.update((ENGINE_DIR / name).read_bytes())
    return h.hexdigest()[:12]


def write(source: Path, target: Path, name: str) -> Path:
    if name in SEARCHED:
        from hosttune_engine.model.tokenizer import Tokenizer

        ids = Tokenizer(source).encode(calibration_text())[:CALIBRATION_TOKENS]
        return write_quantized(source, target, SEARCHED[name], dtype_of(SEARCHED[name]), calibration_ids=ids)
    spec = {**SPECS, **SPLIT_SPECS}[name]
    return write_quantized(source, target, spec, dtype_of(spec))


def cached_pair(source: Path, name: str) -> tuple[Path, Path]:
    """(quantized folder, its fp32 dequantization) of `source` in layout `name`, written once per writer version."""
    root = CACHE / f"quant-{writer_version()}-c{CALIBRATION_TOKENS}" / f"{source.name}-{name}"
    quantized, plain = root / "quantized", root / "dequantized"
    if (plain / "config.json").exists():
        return quantized, plain
    root.parent.mkdir(parents=True, exist_ok=True)
    drop_stale_versions(root.parent)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (plain / "config.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            write(source, quantized, name)
            dequantize_folder(quantized, root / ".dequantized")
            (root / ".dequantized").rename(plain)
    return quantized, plain


STALE_S = 24 * 3600


def drop_stale_versions(current: Path) -> None:
    """Remove other writer versions' folders untouched for a day: each holds several GB of checkpoints."""
    for other in current.parent.glob("quant-*"):
        if other != current and other.is_dir() and time.time() - other.stat().st_mtime > STALE_S:
            shutil.rmtree(other, ignore_errors=True)
