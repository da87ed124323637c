"""Loads engine/scripts/make_tiny_models.py (a script, not a package module) for the fixtures."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "engine" / "scripts" / "make_tiny_models.py"


def build_tiny_models(root: Path) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("make_tiny_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_models(root)
