"""The engine never imports the control plane (docs/design.md: dependencies point one way)."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def imported_modules(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_engine_never_imports_hosttune():
    files = list(ENGINE.rglob("*.py"))
    assert len(files) > 20
    offenders = [f"{f}: {m}" for f in files for m in imported_modules(f) if m == "hosttune" or m.startswith("hosttune.")]
    assert offenders == []
