"""Dependencies point one way; the control plane never imports torch, triton or the engine."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "hosttune"
FORBIDDEN = ("torch", "triton", "hosttune_engine")
# Lower layers must not import higher ones (STYLE rule 2: cli → plan/execute/deploy/build/bench
# → actions → probes → transport). Modules named plan_* belong to the plan layer.
LAYERS = ["transport", "probes", "checks", "fleet", "actions", "plan", "execute", "report", "cli"]


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "hosttune" or len(parts) < 2:
        return None
    name = parts[1].split("_")[0]
    return LAYERS.index(name) if name in LAYERS else None


# Scripts the probe ships to hosts as text and runs there with the host's own python (the
# engine virtualenv's torch); the control plane reads them as data and never imports them.
SHIPPED_TO_HOSTS = {"allreduce_probe.py"}


def test_control_plane_never_imports_ml_stack():
    for path in PKG.rglob("*.py"):
        if path.name in SHIPPED_TO_HOSTS:
            continue
        bad = {m for m in imports(path) if m.split(".")[0] in FORBIDDEN}
        assert not bad, f"{path} imports {bad}"


def test_scripts_shipped_to_hosts_are_never_imported():
    for path in PKG.rglob("*.py"):
        assert not {m.split(".")[-1] for m in imports(path)} & {n.removesuffix(".py") for n in SHIPPED_TO_HOSTS}, path


def test_layers_point_one_way():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        own = layer_of(".".join(rel.parts))
        if own is None:
            continue
        for module in imports(path):
            other = layer_of(module)
            assert other is None or other <= own, f"{path} ({LAYERS[own]}) imports {module} ({LAYERS[other]})"


def test_paramiko_only_in_ssh_transport():
    users = [p for p in PKG.rglob("*.py") if "paramiko" in {m.split(".")[0] for m in imports(p)}]
    assert [p.name for p in users] == ["ssh.py"]
