"""`hosttune verify` plumbing and the apply/rollback/verify CLI surface (read-only here)."""

import json
import os

import pytest
from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.errors import HosttuneError
from hosttune.config.inventory import Host
from hosttune.config.profile import build, load_profile
from hosttune.transport.base import ConnectionSpec
from hosttune.verify import expectations, host_spec, ssh_config, suite_dir

runner = CliRunner()


def ssh_host(name="gpu-01", **kw) -> Host:
    spec = dict(host_name=name, transport="ssh", address="10.0.0.1", port=2222, user="deploy", key="/k/id",
                known_hosts="/k/known", become=True)
    spec.update(kw)
    return Host(name, "g", ConnectionSpec(**spec))


def test_ssh_config_checks_host_keys_and_uses_the_inventory():
    text = ssh_config([ssh_host()], "/tmp/ctl", accept_new_host_keys=False)
    assert 'Host gpu-01\n  HostName "10.0.0.1"\n  Port 2222\n  User "deploy"\n  IdentityFile "/k/id"' in text
    assert 'UserKnownHostsFile "/k/known"' in text and "StrictHostKeyChecking yes" in text and "BatchMode yes" in text
    assert "StrictHostKeyChecking accept-new" in ssh_config([ssh_host()], "/tmp/ctl", accept_new_host_keys=True)


@pytest.mark.parametrize("field", ["address", "user", "key", "known_hosts"])
def test_hostile_values_never_become_ssh_config_directives(field):
    with pytest.raises(HosttuneError, match="cannot be written to an ssh config"):
        ssh_config([ssh_host(**{field: 'x\n  ProxyCommand touch /tmp/pwned'})], "/tmp/ctl", False)
    with pytest.raises(HosttuneError):
        ssh_config([ssh_host(**{field: 'x" ProxyCommand "touch'})], "/tmp/ctl", False)


def test_host_specs():
    assert host_spec(ssh_host(), "/c") == "ssh://gpu-01?ssh_config=/c&sudo=true"
    assert host_spec(Host("localhost", "l", ConnectionSpec("localhost")), "/c") == "local://"


def test_expectations_come_from_the_profile_alone():
    want = expectations(build("p", {"driver": {"version": "2.10", "packages": ["hello"]}, "cuda": {"toolkit": "12.4"}}))
    assert want["driver"] == {"version": "2.10", "held": True, "packages": {"apt": ["hello"], "dnf": ["hello"]}}
    latency = expectations(load_profile("inference-latency"))
    assert latency["driver"]["packages"]["apt"] == ["nvidia-driver-535"] and latency["irqbalance"] is False
    json.dumps(latency)


def _suite():
    """tests/host/test_tuned.py as a module (it imports nothing of hosttune: it is the independent witness)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("suite_tuned", suite_dir() / "test_tuned.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    return suite


def test_a_sub_second_ssh_timeout_is_a_one_second_connect_timeout_not_sshs_none():
    """ssh reads ConnectTimeout 0 as no timeout of its own (the kernel's, minutes): round up instead."""
    assert "  ConnectTimeout 1\n" in ssh_config([ssh_host(timeout_s=0.5)], "/tmp/ctl", accept_new_host_keys=False)
    assert "  ConnectTimeout 3\n" in ssh_config([ssh_host(timeout_s=2.5)], "/tmp/ctl", accept_new_host_keys=False)


def test_the_suite_looks_up_commands_on_the_probes_path():
    from hosttune.probes.gather import probe_script

    assert f"\nPATH={_suite().PROBE_PATH}:$PATH\n".encode() in probe_script()


def test_the_suite_checks_holds_on_the_same_stack_packages_apply_holds():
    from hosttune.checks.driver import STACK_PACKAGE

    assert _suite().STACK.pattern == STACK_PACKAGE.pattern


def test_the_suite_pins_gpu_interrupts_to_the_housekeeping_cores_hosttune_chooses():
    """The witness restates the rule rather than import it; a serving core of the same node must fail it."""
    from dataclasses import replace

    from hosttune import cores
    from hosttune.probes.facts import Facts

    suite = _suite()
    for size in range(1, 130):
        node = tuple(range(64, 64 + size))
        facts = replace(Facts(), cpu=replace(Facts().cpu, online=node), numa_nodes={1: node})
        assert suite.housekeeping(set(node)) == set(cores.housekeeping(facts, 1)), size


@pytest.mark.parametrize("name", ["haltpoll_guest", "a100", "l40s", "h200"])
def test_the_suite_wants_a_c_state_limit_where_hosttune_writes_one(request, name):
    """On the recorded hosts, the witness's restated rule agrees with the check's: a haltpoll guest or a host
    without a cpuidle driver gets no limit, intel_idle hosts do."""
    from types import SimpleNamespace

    from hosttune.checks.cpu import GUEST_IDLE_DRIVERS, cstate_limit_moot

    facts = request.getfixturevalue(name)
    facts = facts["before"] if name == "haltpoll_guest" else facts
    states = "".join(f"{int(disabled)} {latency}\n" for _, disabled, latency in facts.cpu.idle_states)
    replies = {"current_driver": f"{facts.cpu.idle_driver or ''}\n", "state*": states}
    host = SimpleNamespace(run=lambda cmd: SimpleNamespace(stdout=next(v for k, v in replies.items() if k in cmd)))
    suite = _suite()
    assert suite.GUEST_IDLE_DRIVERS == set(GUEST_IDLE_DRIVERS)
    assert suite.c_state_limit_matters(host) is (cstate_limit_moot(facts) is None) is (name in ("a100", "l40s"))


def test_verify_with_become_that_cannot_reach_root_is_one_line_before_any_test(monkeypatch):
    """Else each of the suite's tests fails with the same sudo error."""
    from contextlib import contextmanager

    from hosttune import verify
    from hosttune.transport.base import CommandResult

    class NoSudo:
        def connect(self):
            return None

        def read(self, argv, timeout=None):
            return CommandResult(tuple(argv), 1, "", "sudo: a password is required\n", 0.0)

    monkeypatch.setattr(verify, "open_transport", contextmanager(lambda spec, read_only=False: (yield NoSudo())))
    with pytest.raises(HosttuneError, match=r"^gpu-01: become: true cannot run commands as root: sudo: a password is "
                                            r"required; nothing was verified"):
        verify.preflight([ssh_host()])
    verify.preflight([ssh_host(become=False)])  # no root asked for: connecting is enough


def test_suite_ships_with_hosttune():
    assert (suite_dir() / "test_tuned.py").exists()


def test_cli_lists_apply_rollback_verify():
    out = runner.invoke(app, ["--help"]).output
    for command in ("apply", "rollback", "verify"):
        assert command in out


def test_apply_dry_run_on_this_machine_is_read_only_json():
    result = runner.invoke(app, ["apply", "--dry-run", "--format", "json"])
    doc = json.loads(result.stdout)
    assert doc["dry_run"] is True and doc["run"] is None
    (host,) = doc["hosts"]
    assert host["host"] == "localhost" and host["state"] in ("planned", "ok") and host["changed"] == 0
    assert result.exit_code == doc["exit_code"]


def test_verify_with_an_unreachable_host_says_nothing_ran_and_how_to_verify_the_others(tmp_path):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"defaults:\n  ssh: {{timeout: 3, known_hosts: {tmp_path / 'known'}}}\n"
                         "hosts:\n  dead:\n    address: 127.0.0.1\n    ssh: {port: 1}\n  here:\n    transport: local\n")
    junit = tmp_path / "verify.xml"
    result = runner.invoke(app, ["verify", "-i", str(inventory), "--junit-xml", str(junit)])
    assert result.exit_code == 2 and not junit.exists()
    assert result.stderr.startswith("hosttune: dead: 127.0.0.1:1: connection refused") and len(result.stderr.splitlines()) == 1
    assert result.stderr.rstrip().endswith("nothing was verified: leave these hosts out with --limit to verify the others")


@pytest.mark.parametrize("answer, code", [("echo 'pyenv: python3.99: command not found' >&2; exit 127", 1),
                                          ("echo 'Python 3.99.1'", 0)])
def test_verify_runs_the_pinned_python_rather_than_finding_its_name(tmp_path, monkeypatch, answer, code):
    """A pyenv shim named python3.99 that cannot start is no Python 3.99, as check says too."""
    shim = tmp_path / "bin" / "python3.99"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\n{answer}\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts:\n  localhost:\n    transport: local\n    pins: {python: '3.99'}\n")
    result = runner.invoke(app, ["verify", "-i", str(inventory), "--", "-k", "test_python"])
    assert result.exit_code == code


def test_verify_judges_the_python3_the_probe_runs_not_the_first_on_the_callers_path(tmp_path, monkeypatch):
    """A python3 ahead of the system's on the caller's PATH (a pyenv shim, a venv) is not what check judges."""
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text("#!/bin/sh\necho 'Python 3.99.1'\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts:\n  localhost:\n    transport: local\n    pins: {python: '3.99'}\n")
    checked = json.loads(runner.invoke(app, ["check", "-i", str(inventory), "--format", "json"]).stdout)
    python = next(f for f in checked["hosts"][0]["findings"] if f["check_id"] == "python.version")
    verified = runner.invoke(app, ["verify", "-i", str(inventory), "--", "-k", "test_python"])
    assert verified.exit_code == (0 if python["status"] == "ok" else 1), (python, verified.output)


def test_verify_with_pytest_arguments_that_are_wrong_or_select_nothing_is_exit_2_never_the_unreachable_bit():
    bad = runner.invoke(app, ["verify", "--", "--no-such-pytest-flag"])
    assert bad.exit_code == 2  # pytest's 4 is hosttune's "unreachable host"
    empty = runner.invoke(app, ["verify", "--", "-k", "no_test_has_this_name"])
    assert empty.exit_code == 2
    assert empty.stderr == "hosttune: no test ran: the pytest arguments after -- selected none, so nothing was verified\n"


def test_a_dry_run_with_a_plan_says_planned_and_keeps_the_drift_bit(monkeypatch):
    """Nothing was changed, so the host is not 'changed', and its drift is all left: exit bit 1, as check says."""
    from hosttune.actions.base import FileWrite, Step
    from hosttune.cli import apply as apply_cli
    from hosttune.config.inventory import local_inventory
    from hosttune.plan.host_plan import HostPlan

    host = local_inventory().hosts[0]
    plan = HostPlan(host, "inference-latency", steps=(Step(("mm.thp",), "THP madvise", (FileWrite("/etc/x", b"x"),)),))
    monkeypatch.setattr(apply_cli, "plan_fleet", lambda inv, wanted, options, on_host_done=None: [plan])
    monkeypatch.setattr(apply_cli, "profiles", lambda inv: {})
    monkeypatch.setattr(apply_cli, "apply_plans", lambda *a, **k: pytest.fail("a dry run applied its plan"))
    result = runner.invoke(app, ["apply", "--dry-run", "--format", "json"])
    doc = json.loads(result.stdout)
    (out,) = doc["hosts"]
    assert out["state"] == "planned" and out["changed"] == 0 and out["exit_bits"] == 1
    assert result.exit_code == doc["exit_code"] == 1
    text = runner.invoke(app, ["apply", "--dry-run"])
    assert "1. mm.thp: THP madvise" in text.stdout and text.exit_code == 1


def test_a_dry_run_with_reboot_says_which_hosts_the_run_would_reboot_and_which_it_leaves(monkeypatch):
    from hosttune.actions.base import FileWrite, Step
    from hosttune.cli import apply as apply_cli
    from hosttune.config.inventory import local_inventory
    from hosttune.plan.host_plan import HostPlan

    step = Step(("cpu.cstates",), "C-states", (FileWrite("/etc/default/grub.d/x.cfg", b"x"),), needs_reboot=True)
    plans = [HostPlan(ssh_host(), "inference-latency", steps=(step,)),
             HostPlan(local_inventory().hosts[0], "inference-latency", steps=(step,))]
    monkeypatch.setattr(apply_cli, "plan_fleet", lambda inv, wanted, options, on_host_done=None: plans)
    monkeypatch.setattr(apply_cli, "profiles", lambda inv: {})
    monkeypatch.setattr(apply_cli, "apply_plans", lambda *a, **k: pytest.fail("a dry run applied its plan"))
    lines = runner.invoke(app, ["apply", "--dry-run", "--reboot"]).stdout.splitlines()
    assert lines[-2] == ("--reboot: would reboot gpu-01 once its changes are made, a batch at a time, wait for each to "
                         "come back and re-check it")
    assert lines[-1].startswith("--reboot: would not reboot localhost: this machine runs hosttune")
    assert "--reboot" not in runner.invoke(app, ["apply", "--dry-run"]).stdout
    doc = json.loads(runner.invoke(app, ["apply", "--dry-run", "--reboot", "--format", "json"]).stdout)
    assert doc["reboot"] == {"would_reboot": ["gpu-01"], "would_not_reboot": [
        {"host": "localhost", "reason": "this machine runs hosttune, which cannot wait for its own reboot: reboot it by hand"}]}
    assert json.loads(runner.invoke(app, ["apply", "--dry-run", "--format", "json"]).stdout)["reboot"] is None


def test_rollback_under_a_root_names_the_journal_folder_inside_it(tmp_path):
    (tmp_path / "etc").mkdir()
    result = runner.invoke(app, ["rollback", "--dry-run", "--root", str(tmp_path)])
    assert result.exit_code == 0
    assert result.stdout == f"localhost: nothing: no run left to roll back in {tmp_path}/var/lib/hosttune/runs\n"


@pytest.mark.parametrize("extra", [["--dry-run"], ["--yes"]])
def test_rollback_on_a_folder_that_is_no_os_root_refuses_in_one_line_as_apply_does(tmp_path, extra):
    """An image that did not mount leaves an empty mount point: rollback said it had no run to undo there, exit 0."""
    result = runner.invoke(app, ["rollback", "--root", str(tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert result.stdout == (f"localhost: failed: --root {tmp_path}: does not look like an OS root (no etc folder); "
                             "give the folder the image's root is mounted at\n")


def _help(command: str) -> str:
    """--help as one line of words (rich wraps it into a box)."""
    return " ".join(runner.invoke(app, [command, "--help"]).stdout.replace("│", " ").split())


def test_the_help_of_facts_apply_rollback_verify_and_bench_says_what_they_do():
    assert "with --dry-run, anything the plan would change" in _help("apply")
    assert "Exit code bits: 2 probe or usage error, 4 unreachable host (drift is check's: facts never sets 1)." in _help("facts")
    assert ("(default: each host's latest apply not yet rolled back; a remediate or uncordon step only by its id); one "
            "no host has is an error." in _help("rollback"))
    assert "Hosts read and rolled back in parallel." in _help("rollback") and "probed" not in _help("rollback")
    assert ("2 when a host cannot be reached or an input is wrong (pytest's arguments too, or ones that select no "
            "test), and then nothing is verified." in _help("verify"))
    bench = _help("bench")
    assert "http://gpu-01:8000 (without /v1)" in bench and "(default: 128 without --rate, --trace or --sweep)" in bench
    assert "CSV files and PNG plots; made, and checked writable, before the run." in bench


def test_rollback_of_a_run_no_host_has_is_one_line_and_exit_2(tmp_path):
    """A mistyped --run must not read as "nothing to roll back", exit 0."""
    (tmp_path / "etc").mkdir()
    for extra in ([], ["--dry-run"]):
        result = runner.invoke(app, ["rollback", "--root", str(tmp_path), "--run", "20250102T030405Z-nosuch", *extra])
        assert result.exit_code == 2 and "no run 20250102T030405Z-nosuch in" in result.stdout
        assert result.stderr == ("hosttune: no host has run 20250102T030405Z-nosuch: give a run apply's recap printed "
                                 f"(its journals are under {tmp_path}/var/lib/hosttune/runs in the image), or leave "
                                 "--run out for each host's latest\n")


def test_verify_meets_a_driver_branch_pin_as_check_and_apply_do():
    """pins: {driver: 535}: the independent suite takes 535.129.03 as the pin's, as check and apply's plan do."""
    from hosttune.plan.resolve import matches_pin

    for version, pin in (("535.129.03-0ubuntu1", "535"), ("535.129.03-0ubuntu1", "535.129.03"), ("5350.1-1", "535"),
                         ("550.54.15-0ubuntu1", "535")):
        assert _suite().version_matches(version, pin) == matches_pin(version, pin)
