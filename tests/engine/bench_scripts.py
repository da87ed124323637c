"""Importing a benchmark script of benchmarks/engine/ in a test, and forgetting it after."""

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "engine"


def bench_script(monkeypatch, name: str, *helpers: str):
    """Yield the module `name` of benchmarks/engine/ (a fixture body); the script and the `helpers` it
    imports (with `common`) are dropped from sys.modules after the test."""
    monkeypatch.syspath_prepend(str(BENCH))
    yield importlib.import_module(name)
    for module in (name, *helpers, "common"):
        sys.modules.pop(module, None)
