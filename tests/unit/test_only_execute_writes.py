"""Only hosttune/execute changes hosts; everything else reads them.

A transport has two verbs: `read` (a command that changes nothing: probes, state scripts,
health gates, logs) and `change`. These tests read the control plane's source and hold that
`change`, the backends' `_command` and the host-side file operations (hostops, atomic writes,
kernel writes) are reached only from hosttune/execute, for apply and deploy alike; and that a
transport opened read-only (check, plan, verify) refuses to change its host.
"""

import ast
from pathlib import Path

import pytest

from hosttune.errors import ReadOnlyError
from hosttune.transport.base import ConnectionSpec, Transport
from hosttune.transport.local import LocalTransport

PKG = Path(__file__).resolve().parents[2] / "hosttune"
EXECUTE, TRANSPORT = PKG / "execute", PKG / "transport"
CHANGING_VERBS = {"change", "_command"}
HOST_WRITERS = {"hostops", "write_file", "kernel_write", "perform"}  # hosttune.execute's own writers


def sources(outside: tuple[Path, ...]) -> list[Path]:
    return [p for p in PKG.rglob("*.py") if not any(p.is_relative_to(d) for d in outside)]


def calls(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every call: `f(...)` gives f, `x.f(...)` gives .f."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                found.append((node.lineno, "." + node.func.attr))
            elif isinstance(node.func, ast.Name):
                found.append((node.lineno, node.func.id))
    return found


def imported_names(path: Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
            for a in node.names}


def test_only_execute_sends_a_changing_command():
    offenders = [f"{p.relative_to(PKG.parent)}:{line} calls {name}" for p in sources((EXECUTE, TRANSPORT))
                 for line, name in calls(p) if name.lstrip(".") in CHANGING_VERBS]
    assert not offenders, "only hosttune/execute changes hosts; read through transport.read:\n" + "\n".join(offenders)


def test_host_side_writers_are_used_only_inside_execute():
    offenders = [f"{p.relative_to(PKG.parent)} imports {name} from {module}" for p in sources((EXECUTE,))
                 for module, name in imported_names(p)
                 if module.startswith("hosttune.execute") and (name in HOST_WRITERS or module == "hosttune.execute.remote")]
    assert not offenders, "\n".join(offenders)


def test_transports_have_no_verb_that_hides_whether_it_changes_the_host():
    # `run` was once the one verb for both; code must say `read` or (in execute) `change`.
    assert not hasattr(Transport, "run") and not hasattr(LocalTransport, "run")
    offenders = [f"{p.relative_to(PKG.parent)}:{node.lineno}" for p in sources(())
                 for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
                 and "transport" in ast.unparse(node.func.value).lower()]
    assert not offenders, offenders


def test_deploy_reaches_hosts_only_through_reads_and_execute():
    deploy = PKG / "deploy"
    for path in deploy.glob("*.py"):
        for module, name in imported_names(path):
            if module.startswith("hosttune.execute"):
                assert (module, name) in {("hosttune.execute.perform", "run_ops"),
                                          ("hosttune.execute.perform", "OperationFailed")}, (path, module, name)


def test_a_read_only_transport_refuses_to_change_its_host(tmp_path):
    target = tmp_path / "untouched"
    with LocalTransport(read_only=True) as transport:
        assert transport.read(["true"]).ok
        with pytest.raises(ReadOnlyError, match="read-only"):
            transport.change(["touch", str(target)])
    assert not target.exists()
    with LocalTransport() as transport:
        assert transport.change(["touch", str(target)]).ok and target.exists()


@pytest.mark.parametrize("module, call", [
    ("hosttune.fleet", lambda m, host: m.probe(host)),
    ("hosttune.plan.host_plan", lambda m, host: m.plan_host(host, None, m.PlanOptions())),
])
def test_check_and_plan_open_their_transports_read_only(monkeypatch, module, call):
    import importlib

    from hosttune.config.inventory import Host

    mod = importlib.import_module(module)
    opened = []

    class Stop(Exception):
        pass

    def open_transport(spec, **kwargs):
        opened.append(kwargs)
        raise Stop

    monkeypatch.setattr(mod, "open_transport", open_transport)
    with pytest.raises(Stop):
        call(mod, Host("h", "g", ConnectionSpec("h")))
    assert opened == [{"read_only": True}]
