"""Dependencies point one way; the control plane never imports torch, triton or the engine."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "hosttune"
FORBIDDEN = ("torch", "triton", "hosttune_engine")
# Dependencies point one way (STYLE rule 2: cli → plan/execute/deploy/build/bench → actions →
# probes → transport). Every package and top-level module of hosttune/ has a place here: a
# module may import its own unit and the layers below it, never a layer above, and the units
# of one layer are independent of each other. `__init__` is the package itself.
LAYERS = [
    ("__init__", "errors"),            # the version; the typed errors every layer raises
    ("quoting", "cpulist", "fleet_runner"),  # shell and systemd quoting; CPU list syntax; hosts in parallel, outcomes, exit bits
    ("transport",),                    # run a command, read and put a file: local or SSH
    ("config", "presets", "probes"),   # inventory, profile, engine presets; read-only facts
    ("cores",),                        # housekeeping cores, from facts
    ("checks",),                       # facts and profile in, findings out
    ("fleet",),                        # check many hosts: probe, checks, reports
    ("actions",),                      # findings in, operations out; never run
    ("plan", "build", "bench", "verify"),
    ("execute",),                      # the one writer to hosts
    ("deploy",),
    ("report",),                       # table, JSON, JUnit, Prometheus
    ("cli",),
    ("__main__",),                     # python -m hosttune
]


def imports(path: Path) -> set[str]:
    """The modules a file imports; `from hosttune import cores` counts as `hosttune.cores`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "hosttune":
                names.update(f"hosttune.{a.name}" for a in node.names if is_submodule(a.name))
    return names


def is_submodule(name: str) -> bool:
    return (PKG / name).is_dir() or (PKG / f"{name}.py").is_file()


UNITS = {unit: number for number, layer in enumerate(LAYERS) for unit in layer}


def unit_of(module: str) -> str | None:
    """`hosttune.checks.cpu` → `checks`; `hosttune` → `__init__`; None outside the package."""
    parts = module.split(".")
    if parts[0] != "hosttune":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, package: Path = PKG) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_units() -> set[str]:
    """Every package and top-level module under hosttune/ (the package itself is `__init__`)."""
    return {unit_of(module_name(path)) for path in PKG.rglob("*.py")}


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


def test_every_package_and_module_has_a_layer():
    assert package_units() == set(UNITS), (
        f"without a layer: {sorted(package_units() - set(UNITS))}; not in hosttune/: {sorted(set(UNITS) - package_units())}")


def layer_faults(path: Path, package: Path = PKG) -> list[str]:
    own, name = unit_of(module_name(path, package)), path.relative_to(package.parent)
    faults = []
    for module in sorted(imports(path)):
        other = unit_of(module)
        if other is None or other == own:
            continue
        if other not in UNITS:
            faults.append(f"{name} imports {module}, which has no layer")
        elif UNITS[other] >= UNITS[own]:
            where = "beside it" if UNITS[other] == UNITS[own] else "above it"
            faults.append(f"{name} ({own}) imports {module} ({other}, a layer {where})")
    return faults


def test_layers_point_one_way():
    faults = [fault for path in PKG.rglob("*.py") for fault in layer_faults(path)]
    assert not faults, "\n".join(faults)


def test_an_upward_import_is_a_fault(tmp_path):
    """The check itself: a probe importing a check, a unit importing its peer or a module without a layer fails."""
    package = tmp_path / "hosttune"
    probe, peer = package / "probes" / "bad.py", package / "config" / "bad.py"
    for path in (probe, peer):
        path.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("from hosttune import checks, cpulist\nfrom hosttune.transport.base import Transport\n")
    peer.write_text("import hosttune.presets\nfrom hosttune.newthing import thing\n")
    assert layer_faults(probe, package) == ["hosttune/probes/bad.py (probes) imports hosttune.checks (checks, a layer above it)"]
    assert layer_faults(peer, package) == ["hosttune/config/bad.py imports hosttune.newthing, which has no layer",
                                           "hosttune/config/bad.py (config) imports hosttune.presets (presets, a layer beside it)"]


def test_paramiko_only_in_ssh_transport():
    users = [p for p in PKG.rglob("*.py") if "paramiko" in {m.split(".")[0] for m in imports(p)}]
    assert [p.name for p in users] == ["ssh.py"]
