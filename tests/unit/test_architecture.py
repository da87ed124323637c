"""Dependencies point one way; the control plane never imports torch, triton or the engine."""

from pathlib import Path

from layering import Layering

PKG = Path(__file__).resolve().parents[2] / "hosttune"
FORBIDDEN = ("torch", "triton", "hosttune_engine")
# Dependencies point one way (STYLE rule 2: cli → plan/execute/deploy/build/bench → actions →
# probes → transport). Every package and top-level module of hosttune/ has a place here: a
# module may import its own unit and the layers below it, never a layer above, and the units
# of one layer are independent of each other. `__init__` is the package itself.
LAYERS = Layering(PKG, (
    ("__init__", "errors"),            # the version; the typed errors every layer raises
    ("quoting", "cpulist", "fleet_runner"),  # shell and systemd quoting; CPU list syntax; hosts in parallel, outcomes, exit bits
    ("transport",),                    # run a command, read and put a file: local or SSH
    ("config", "presets", "probes", "rendering"),  # inventory, profile, engine presets; read-only facts; templates/ rendered
    ("cores",),                        # housekeeping cores, from facts
    ("checks",),                       # facts and profile in, findings out
    ("fleet",),                        # check many hosts: probe, checks, reports
    ("actions", "status_file"),        # findings in, operations out; never run; a monitor pass's status document
    ("plan", "build", "bench", "verify", "status", "monitor_pass"),  # ...; the fleet's status files; one monitor pass
    ("execute",),                      # the one writer to hosts
    ("deploy",),
    ("remediate",),                    # the remediation ladder: faults, rungs, breaker, climbing
    ("report",),                       # table, JSON, JUnit, Prometheus
    ("cli",),
    ("__main__",),                     # python -m hosttune
))


# Scripts the probe ships to hosts as text and runs there with the host's own python (the
# engine virtualenv's torch); the control plane reads them as data and never imports them.
SHIPPED_TO_HOSTS = {"allreduce_probe.py", "prefix_router.py"}


def test_control_plane_never_imports_ml_stack():
    for path in LAYERS.modules():
        if path.name in SHIPPED_TO_HOSTS:
            continue
        bad = {m for m in LAYERS.imports(path) if m.split(".")[0] in FORBIDDEN}
        assert not bad, f"{path} imports {bad}"


def test_scripts_shipped_to_hosts_are_never_imported():
    for path in LAYERS.modules():
        assert not {m.split(".")[-1] for m in LAYERS.imports(path)} & {n.removesuffix(".py") for n in SHIPPED_TO_HOSTS}, path


def test_every_package_and_module_has_a_layer():
    assert not LAYERS.unplaced(), LAYERS.unplaced()


def test_layers_point_one_way():
    faults = LAYERS.all_faults()
    assert not faults, "\n".join(faults)


def test_an_upward_import_is_a_fault(tmp_path):
    """The check itself: a probe importing a check, a unit importing its peer or a module without a layer fails."""
    package = tmp_path / "hosttune"
    probe, peer = package / "probes" / "bad.py", package / "config" / "bad.py"
    for path in (probe, peer):
        path.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("from hosttune import checks, cpulist\nfrom hosttune.transport.base import Transport\n")
    peer.write_text("import hosttune.presets\nfrom hosttune.newthing import thing\n")
    planted = LAYERS.at(package)
    assert planted.faults(probe) == ["hosttune/probes/bad.py (probes) imports hosttune.checks (checks, a layer above it)"]
    assert planted.faults(peer) == ["hosttune/config/bad.py imports hosttune.newthing, which has no layer",
                                    "hosttune/config/bad.py (config) imports hosttune.presets (presets, a layer beside it)"]


def test_paramiko_only_in_ssh_transport():
    users = [p for p in LAYERS.modules() if "paramiko" in {m.split(".")[0] for m in LAYERS.imports(p)}]
    assert [p.name for p in users] == ["ssh.py"]
