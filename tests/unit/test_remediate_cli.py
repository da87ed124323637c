"""`hosttune remediate` and `hosttune uncordon` through typer's CliRunner, on an inventory whose hosts are
scripted: each answers the probe with recorded A100 facts and state.sh with its own serving state (or cannot
be reached). Nothing is changed on any host: only plans are asked for, or the change is a recording fake."""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from types import SimpleNamespace

import pytest
from deploy_fixtures import a100_facts
from typer.testing import CliRunner

from hosttune.cli import common
from hosttune.cli import remediate as remediate_cli
from hosttune.cli.app import app
from hosttune.errors import ProbeError, TransportError
from hosttune.probes.facts_health import GpuHealth, KernelLog
from hosttune.config.inventory import local_inventory
from hosttune.remediate import climb, render
from hosttune.remediate.breaker import Breaker, BreakerPolicy
from hosttune.remediate.climb import planned
from hosttune.remediate.cordon import Uncordon
from hosttune.remediate.faults import MISSING_LADDER, Fault, FaultKind
from hosttune.remediate.rungs import Rung
from hosttune.remediate.state import parse_snapshot
from hosttune.remediate.steps import LadderOptions
from hosttune.remediate.survey import Survey
from hosttune.remediate.xid import XidPolicy
from hosttune.transport.base import CommandResult, Transport
from hosttune.remediate import survey

runner = CliRunner()
_RECORDED = a100_facts()  # recorded without root and without nvidia-smi -q -x: no kernel log, no health fields
_READ = dict(temp_c=40, slowdown_margin_c=40, power_limit_w=400.0, power_default_w=400.0)  # what -q -x adds
FACTS = dataclasses.replace(_RECORDED, health=dataclasses.replace(
    _RECORDED.health, kernel_log=KernelLog("dmesg"), gpus=tuple(GpuHealth(g.index, g.bdf, **_READ) for g in _RECORDED.gpu.gpus),
    uvm_loaded=True, device_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm", *(f"/dev/nvidia{g.index}" for g in _RECORDED.gpu.gpus))),
    probe_errors=(), unread=())  # what the recording's older probe did not read, read
LB = "/opt/hosttune/releases/r1/.hosttune/replica_lb.py"
REPLICAS = json.dumps({"replicas": [{"index": 0, "port": 8101, "gpus": [0]}]})
SERVING = f"boot:b1/17\nreplicas:{REPLICAS}\nlb:{LB}\nunit:hosttune-engine@0.service active\n"
CORDONED = SERVING + 'cordon:{"at": 1800000000, "reason": "GPU0: Xid 79", "run": "R"}\n'
UNREACHABLE = None




RUNS_DIRS: dict[str, str] = {}  # host -> what needs.sh says of /var/lib/hosttune/runs there (default: a directory)
WRITES: dict[str, str] = {}  # host -> what needs.sh says of where the climb's files go (default: room, no blocker)


class StateScript(Transport):
    """A host that answers state.sh with `state`, and needs.sh's questions where a run's journal goes with `runs`
    and where its files go with `writes`; it is read-only, as a survey opens it."""

    def __init__(self, host_name: str, state: str, runs: str = "kind:dir", writes: str = "free-kb:1000000 /"):
        self.host_name, self.state, self.runs, self.writes, self.read_only = host_name, state, runs, writes, True

    def _command(self, argv, stdin, timeout):
        if "dir:/var/lib/hosttune/runs" in argv:
            asked = [a for a in argv if a.startswith(("dir:", "space:"))]
            answers = (f"@@n:{i}\n{self.runs if a.startswith('dir:') else self.writes}\n@@n-end:{i}\n"
                       for i, a in enumerate(asked))
            return CommandResult(tuple(argv), 0, "".join(answers), "", 0.0)
        return CommandResult(tuple(argv), 0, self.state, "", 0.0)


INVENTORY = "hosts:\n  gpu-01: {address: 10.0.0.1}\n  gpu-02: {address: 10.0.0.2}\n  gpu-03: {address: 10.0.0.3}\n"


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """gpu-01..03; set `states[name]` to what state.sh prints there (UNREACHABLE: SSH refuses). Yields -i FILE."""
    states: dict[str, str | None] = {}

    def open_transport(spec, read_only=False):
        if states[spec.host_name] is UNREACHABLE:
            raise TransportError(f"{spec.host_name}: connection refused (is sshd running, and on this port?)")
        return StateScript(spec.host_name, states[spec.host_name], RUNS_DIRS.get(spec.host_name, "kind:dir"),
                           WRITES.get(spec.host_name, "free-kb:1000000 /"))

    RUNS_DIRS.clear()
    WRITES.clear()
    monkeypatch.setattr(survey, "open_transport", open_transport)
    monkeypatch.setattr(survey, "gather", lambda transport, *a, **k: SimpleNamespace(facts=FACTS))
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    return states, ["-i", str(tmp_path / "inv.yaml")]


def test_uncordon_shows_what_it_would_do_and_an_unreachable_host_is_exit_4(fleet):
    states, inv = fleet
    states.update({"gpu-01": CORDONED, "gpu-02": SERVING, "gpu-03": UNREACHABLE})
    result = runner.invoke(app, ["uncordon", *inv, "--dry-run"])
    assert result.exit_code == 4, result.output  # gpu-03 may be cordoned too: nobody could tell
    lines = result.stdout.splitlines()
    assert lines[:3] == ["gpu-01: cordoned since 2027-01-15 08:00:00Z (GPU0: Xid 79)", "    uncordon the host",
                         "      $ systemctl start hosttune-engine@0.service"]
    # the cordon goes last: a replica that does not come back leaves the host cordoned, to take back again
    assert lines[-4:] == [f"      $ python3 {LB} in 0", "      remove /var/lib/hosttune/cordon.json",
                          "gpu-02: not cordoned, nothing to do",
                          "gpu-03: unreachable: gpu-03: connection refused (is sshd running, and on this port?)"]
    assert "ladder" not in result.stdout and "remediate" not in result.stdout  # remediate's plan is not uncordon's


def test_uncordon_takes_back_the_cordoned_host_only_and_still_reports_the_unreachable_one(fleet, monkeypatch):
    states, inv = fleet
    states.update({"gpu-01": CORDONED, "gpu-02": SERVING, "gpu-03": UNREACHABLE})
    taken: list[str] = []

    def uncordon_host(survey, run):
        taken.append(survey.host.name)
        return Uncordon(survey, True, run)

    monkeypatch.setattr(remediate_cli, "uncordon_host", uncordon_host)
    result = runner.invoke(app, ["uncordon", *inv, "--yes"])
    assert taken == ["gpu-01"] and result.exit_code == 4, result.output
    assert [line for line in result.stdout.splitlines() if "uncordoned" in line] == [
        line for line in result.stdout.splitlines() if line.startswith("gpu-01: uncordoned (run ")]


def test_uncordon_reads_only_the_serving_state_so_a_host_whose_probe_hangs_can_be_taken_back(fleet, monkeypatch):
    states, inv = fleet
    states.update({"gpu-01": CORDONED, "gpu-02": SERVING, "gpu-03": SERVING})

    def hangs(*args, **kwargs):
        raise ProbeError("the probe did not finish within 60s")

    monkeypatch.setattr(survey, "gather", hangs)
    result = runner.invoke(app, ["uncordon", *inv, "--dry-run"])
    assert result.exit_code == 0 and result.stdout.startswith("gpu-01: cordoned since"), result.output
    assert "      remove /var/lib/hosttune/cordon.json" in result.stdout
    remediate = runner.invoke(app, ["remediate", *inv, "--dry-run"])  # remediate probes: it needs the faults
    assert remediate.exit_code == 2 and "gpu-02: error: the probe did not finish within 60s" in remediate.stdout


def test_a_cordon_file_written_by_hand_or_a_broken_ledger_is_that_hosts_one_line_error(fleet):
    states, inv = fleet
    states.update({"gpu-01": SERVING + 'cordon:{"at": "2026-12-05 08:00", "reason": "PSU"}\n',
                   "gpu-02": CORDONED + "ledger:{not json\n", "gpu-03": SERVING})
    for command in ("remediate", "uncordon"):
        result = runner.invoke(app, [command, *inv, "--dry-run"])
        assert result.exit_code == 2 and "internal error" not in result.output, result.output
        (one, two, *_, last) = result.stdout.splitlines()
        assert one == ("gpu-01: error: the host's cordon file /var/lib/hosttune/cordon.json: at must be Unix time in "
                       "seconds (got '2026-12-05 08:00'); fix it, or remove it to uncordon the host")
        assert last.startswith("gpu-03: ") and "error" not in last  # the others are surveyed all the same
        if command == "remediate":
            assert two.startswith("gpu-02: error: the remediation ledger /var/lib/hosttune/remediate/ledger.json is not valid")
        else:  # uncordon needs no ledger: a broken one does not keep a cordoned host out
            assert two == "gpu-02: cordoned since 2027-01-15 08:00:00Z (GPU0: Xid 79)"


def test_a_file_where_the_runs_journal_goes_stops_remediate_and_uncordon_at_plan_time(fleet, monkeypatch):
    states, inv = fleet
    states.update({"gpu-01": SERVING.replace(" active", " failed"), "gpu-02": CORDONED, "gpu-03": SERVING})
    RUNS_DIRS.update({"gpu-01": "kind:absent\nblocked:/var/lib/hosttune", "gpu-02": "kind:other"})
    monkeypatch.setattr(climb, "execute_step", lambda *a, **k: pytest.fail("a step was sent"))
    monkeypatch.setattr(remediate_cli, "uncordon_host", lambda *a: pytest.fail("an uncordon was sent"))
    journal = "is not a directory, and the run's journal goes in /var/lib/hosttune/runs; move it away first"
    for confirm in ("--dry-run", "--yes"):
        remediate = runner.invoke(app, ["remediate", *inv, confirm])
        assert remediate.exit_code & 2 and "ladder" not in remediate.stdout, remediate.output
        assert remediate.stdout.splitlines()[0] == f"gpu-01: error: nothing sent: /var/lib/hosttune {journal}"
        uncordon = runner.invoke(app, ["uncordon", *inv, confirm])
        assert uncordon.exit_code == 2, uncordon.output
        assert uncordon.stdout.splitlines()[1] == f"gpu-02: error: nothing sent: /var/lib/hosttune/runs {journal}"
    RUNS_DIRS.clear()  # the same hosts, their journal's folder fine: a rung and a cordoned host to take back
    assert "    ladder: restart" in runner.invoke(app, ["remediate", *inv, "--dry-run"]).stdout
    assert "gpu-02: cordoned since" in runner.invoke(app, ["uncordon", *inv, "--dry-run"]).stdout


def test_a_file_where_the_ledger_goes_stops_remediate_at_plan_time(fleet, monkeypatch):
    """The climb writes its ledger under /var/lib/hosttune/remediate, apart from the journal: a file there would
    fail the run after its first rung."""
    states, inv = fleet
    states.update({"gpu-01": SERVING.replace(" active", " failed"), "gpu-02": SERVING, "gpu-03": SERVING})
    WRITES["gpu-01"] = "free-kb:1000000 /\nblocked:/var/lib/hosttune/remediate"
    monkeypatch.setattr(climb, "execute_step", lambda *a, **k: pytest.fail("a step was sent"))
    for confirm in ("--dry-run", "--yes"):
        remediate = runner.invoke(app, ["remediate", *inv, confirm])
        assert remediate.exit_code & 2 and "ladder" not in remediate.stdout, remediate.output
        assert remediate.stdout.splitlines()[0] == ("gpu-01: error: nothing sent: /var/lib/hosttune/remediate is not "
                                                    "a directory; move it away first")
    WRITES.clear()
    assert "    ladder: restart" in runner.invoke(app, ["remediate", *inv, "--dry-run"]).stdout


@pytest.mark.parametrize("reboot, why", [
    (False, "--reboot not given"),
    (True, "this machine runs hosttune, which cannot wait for its own reboot: reboot it by hand"),
])
def test_a_reboot_the_climb_would_skip_the_plan_skips_too_and_shows_the_cordon_it_takes_first(monkeypatch, reboot, why):
    missing = Fault(FaultKind.GPU_MISSING, "gpu.count", MISSING_LADDER, "GPU2 is on PCI but not in NVML", gpu=2)
    here = Survey(local_inventory().hosts[0], "inference-latency", snapshot=parse_snapshot(SERVING), faults=(missing,))
    options = LadderOptions(reboot=reboot)
    plan = render.render_plan([planned(here)], options).splitlines()
    assert plan[3:5] == [f"    reboot: skipped: {why}", "    first: cordon the host"]
    assert plan[5].startswith("      write /var/lib/hosttune/cordon.json (")
    done: list[str] = []
    monkeypatch.setattr(climb, "execute_step", lambda survey, step, run: (done.append(step.summary), (True, ""))[1])
    monkeypatch.setattr(climb, "reboot_and_wait", lambda *a: pytest.fail("this machine was rebooted"))
    ctx = climb.Context({}, options, XidPolicy(), Breaker(BreakerPolicy(100.0), 1, [], 0.0), "R")
    result = climb.Climber(here, ctx).climb(missing)
    assert done == ["cordon the host"] and [(o.rung, o.status, o.detail) for o in result.rungs] == [
        (Rung.REBOOT, "skipped", why), (Rung.CORDON, "done", "cordon the host")]
    assert "never the machine hosttune runs on" in runner.invoke(app, ["explain", "remediate.reboot"]).stdout


def test_json_plan_is_shown_before_a_terminal_is_asked_and_when_nothing_changes(fleet, monkeypatch):
    states, inv = fleet
    states.update({"gpu-01": SERVING.replace(" active", " failed"), "gpu-02": SERVING, "gpu-03": SERVING})
    monkeypatch.setattr(common, "is_terminal", lambda: True)
    asked = runner.invoke(app, ["remediate", *inv, "--format", "json"], input="n\n")
    monkeypatch.setattr(common, "is_terminal", lambda: False)
    refused = runner.invoke(app, ["remediate", *inv, "--format", "json"])
    for result in (asked, refused):
        assert result.exit_code == 2, result.output
        plan, _ = json.JSONDecoder().raw_decode(result.stdout)  # then CliRunner's echo of the answer
        assert plan["dry_run"] and [h["host"] for h in plan["hosts"] if h["faults"]] == ["gpu-01"]
    assert "Remediate 1 host? [y/N]" in asked.stderr


def test_the_plan_says_how_many_cordons_the_breaker_leaves_room_for(fleet):
    states, inv = fleet
    just_cordoned = SERVING + f'cordon:{{"at": {time.time() - 60}, "reason": "GPU0: Xid 79"}}\n'
    states.update({"gpu-01": SERVING.replace(" active", " failed"), "gpu-02": SERVING, "gpu-03": just_cordoned})
    now_cordoned = "circuit breaker: 1 of 3 hosts cordoned within 60 min; {} more may be (--max-cordoned-percent {})"
    for percent, room in (("10", 0), ("66.7", 1), ("100", 2)):
        result = runner.invoke(app, ["remediate", *inv, "--dry-run", "--max-cordoned-percent", percent])
        assert result.stdout.splitlines()[-1].startswith(now_cordoned.format(room, percent)), result.output
        as_json = runner.invoke(app, ["remediate", *inv, "--dry-run", "--max-cordoned-percent", percent, "--format", "json"])
        assert json.loads(as_json.stdout)["breaker_room"] == room  # automation reads the same room as the text


@pytest.mark.parametrize("percent, num_hosts, num_cordoned", [(10, 1, 0), (10, 10, 0), (10, 20, 1), (15, 20, 0),
                                                             (33.3, 3, 0), (33.4, 3, 0), (0, 5, 0), (100, 4, 1)])
def test_the_breakers_room_is_the_cordons_it_grants(percent, num_hosts, num_cordoned):
    breaker = Breaker(BreakerPolicy(percent), num_hosts, [1.0] * num_cordoned, 1.0)
    room, granted = breaker.room, 0
    while not breaker.cordon(f"h{granted}"):
        granted += 1
    assert granted == room


@pytest.mark.parametrize("command", ["uncordon", "remediate", "status"])
def test_an_empty_limit_is_refused_rather_than_taken_for_every_host(command):
    result = runner.invoke(app, [command, "--limit", "", *(["--dry-run"] if command != "status" else [])])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == "hosttune: --limit '' names no host or group; leave --limit out for every host\n"


def test_a_limit_that_matches_nothing_here_says_the_default_inventory_is_this_machine():
    result = runner.invoke(app, ["uncordon", "--limit", "gpu-07", "--dry-run"])
    assert result.exit_code == 2 and result.stderr == (
        "hosttune: --limit 'gpu-07' matches no host or group in the default inventory (this machine, named localhost)\n")


def test_the_uncordon_command_remediate_suggests_names_the_inventory_and_takes_the_host_back(fleet):
    states, inv = fleet
    states.update({"gpu-01": CORDONED, "gpu-02": SERVING, "gpu-03": SERVING})
    result = runner.invoke(app, ["remediate", *inv, "--dry-run"])
    first = result.stdout.splitlines()[0]
    assert first == f"gpu-01: cordoned since 2027-01-15 08:00:00Z (GPU0: Xid 79); hosttune uncordon -i {inv[1]} -l gpu-01 takes it back"
    argv = shlex.split(first.split("; ")[1].removesuffix(" takes it back"))
    taken = runner.invoke(app, [*argv[1:], "--dry-run"])
    assert taken.exit_code == 0 and taken.stdout.splitlines()[:2] == [
        "gpu-01: cordoned since 2027-01-15 08:00:00Z (GPU0: Xid 79)", "    uncordon the host"]


@pytest.mark.parametrize("cordon, got", [
    ('{"at": NaN, "reason": "PSU"}', "nan"), ('{"at": Infinity}', "inf"), ('{"at": 1e20}', "1e+20"),
    ('{"at": true, "reason": "PSU"}', "True"), ('{"reason": "PSU"}', "None"),
])
def test_a_cordon_time_that_is_no_time_is_that_hosts_one_line_error_and_the_others_are_planned(fleet, cordon, got):
    states, inv = fleet
    states.update({"gpu-01": SERVING + f"cordon:{cordon}\n", "gpu-02": CORDONED, "gpu-03": SERVING})
    for command in ("remediate", "uncordon"):
        result = runner.invoke(app, [command, *inv, "--dry-run"])
        assert result.exit_code & 2 and "internal error" not in result.output, result.output
        assert result.stdout.splitlines()[0] == (
            f"gpu-01: error: the host's cordon file /var/lib/hosttune/cordon.json: at must be Unix time in seconds "
            f"(got {got}); fix it, or remove it to uncordon the host")
        assert "gpu-02: cordoned since 2027-01-15 08:00:00Z" in result.stdout and "gpu-03: " in result.stdout


@pytest.mark.parametrize("state, said", [
    ("cordon:\n", "the host's cordon file /var/lib/hosttune/cordon.json is not a JSON object (it is empty); fix it, "
                   "or remove it to uncordon the host"),
    ("cordon:yes\n", "the host's cordon file /var/lib/hosttune/cordon.json is not JSON (Expecting value: line 1 column "
                      "1 (char 0)); fix it, or remove it to uncordon the host"),
    ("cordon:[]\n", "the host's cordon file /var/lib/hosttune/cordon.json is not a JSON object (it is a list); fix it, "
                     "or remove it to uncordon the host"),
    ("replicas:\n", "the live release's /opt/hosttune/current/.hosttune/replicas.json is not a JSON object (it is empty); "
                     "deploy the release again to rewrite it"),
])
def test_an_empty_or_garbled_state_file_is_named_with_what_to_do(fleet, state, said):
    """An empty cordon file (touched by hand, a full disk) said "the host's cordon file is not JSON: Expecting value:
    line 1 column 1 (char 0)": no path, and nothing to do about it."""
    states, inv = fleet
    states.update({"gpu-01": SERVING.replace(f"replicas:{REPLICAS}\n", "") + state, "gpu-02": SERVING, "gpu-03": SERVING})
    for command in ("remediate", "uncordon"):
        result = runner.invoke(app, [command, *inv, "--dry-run"])
        assert result.exit_code == 2 and result.stdout.splitlines()[0] == f"gpu-01: error: {said}", result.output


def test_replicas_json_with_a_number_no_integer_holds_is_that_hosts_error_not_an_internal_one(fleet):
    states, inv = fleet
    states.update({"gpu-01": SERVING.replace(f"replicas:{REPLICAS}", 'replicas:{"replicas": [{"index": Infinity, '
                                             '"port": 8101}]}'), "gpu-02": SERVING, "gpu-03": SERVING})
    for command in ("remediate", "uncordon"):
        result = runner.invoke(app, [command, *inv, "--dry-run"])
        assert result.exit_code == 2 and result.stdout.splitlines()[0] == (
            "gpu-01: error: the live release's /opt/hosttune/current/.hosttune/replicas.json is not a list of replicas "
            "with index, port and gpus (OverflowError: cannot convert float infinity to integer); deploy the release "
            "again to rewrite it"), result.output


@pytest.mark.parametrize("seen, xids", [
    ('[["0000:3b:00", 79]]', "[]"), ('"0000:3b:00"', "[]"), ('[["0000:3b:00", 79, "twice"]]', "[]"),
    ('[["0000:3b:00", 79, Infinity]]', "[]"),  # Infinity stopped every host with an internal error
    ("[]", '[{"bdf": "0000:3b:00", "code": 79, "at": NaN}]'),  # a NaN time fell out of every window: Xids not counted
])
def test_a_ledger_whose_counts_are_garbled_is_that_hosts_one_line_error(fleet, seen, xids):
    states, inv = fleet
    ledger = f'{{"boot": "b1/17", "seen": {seen}, "xids": {xids}, "recovered": []}}'
    states.update({"gpu-01": SERVING + f"ledger:{ledger}\n", "gpu-02": SERVING, "gpu-03": SERVING})
    result = runner.invoke(app, ["remediate", *inv, "--dry-run"])
    assert result.exit_code == 2 and "internal error" not in result.output, result.output
    assert result.stdout.splitlines()[0].startswith(
        "gpu-01: error: the remediation ledger /var/lib/hosttune/remediate/ledger.json is not valid (")
    assert result.stdout.splitlines()[0].endswith("): move it aside to start a new one")


def test_a_host_whose_kernel_log_cannot_be_read_is_not_called_ok_for_want_of_seeing_its_xids(fleet, monkeypatch):
    """A login that is not root reads no kernel log: no Xid can be seen, so no Xid fault can be found."""
    states, inv = fleet
    states.update({"gpu-01": SERVING, "gpu-02": SERVING, "gpu-03": SERVING})
    blind = dataclasses.replace(FACTS, health=dataclasses.replace(FACTS.health, kernel_log=KernelLog(source=None)))
    monkeypatch.setattr(survey, "gather", lambda transport, *a, **k: SimpleNamespace(
        facts=blind if transport.host_name == "gpu-01" else FACTS))
    result = runner.invoke(app, ["remediate", *inv, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stdout.splitlines()[0] == (
        "gpu-01: no fault found, but remediate cannot see all it acts on: gpu.xid cannot be judged (cannot read the "
        "kernel log (dmesg or journalctl -k): run as root (become: true))")
    assert "gpu-02: ok, nothing to remediate" in result.stdout
    (host, *_) = json.loads(runner.invoke(app, ["remediate", *inv, "--dry-run", "--format", "json"]).stdout)["hosts"]
    assert host["exit_bits"] == 2 and host["cannot_judge"] == [
        {"check_id": "gpu.xid", "detail": "cannot read the kernel log (dmesg or journalctl -k): run as root (become: true)"}]


def test_a_host_the_probe_could_not_read_all_of_is_not_called_ok(fleet, monkeypatch):
    """A part of the host the probe could not read (nvidia-smi output it cannot parse) may hide a fault: the plan
    says so, as check does with exit 2, instead of `ok, nothing to remediate`."""
    states, inv = fleet
    states.update({"gpu-01": SERVING, "gpu-02": SERVING, "gpu-03": SERVING})
    problem = "smi-xml: invalid literal for int() with base 16: 'gpu 0000'"
    partial = dataclasses.replace(FACTS, probe_errors=(problem,))
    monkeypatch.setattr(survey, "gather", lambda transport, *a, **k: SimpleNamespace(
        facts=partial if transport.host_name == "gpu-01" else FACTS))
    result = runner.invoke(app, ["remediate", *inv, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stdout.splitlines()[0] == (
        f"gpu-01: no fault found, but remediate cannot see all it acts on: the probe could not read all of the host ({problem})")
    (host, *_) = json.loads(runner.invoke(app, ["remediate", *inv, "--dry-run", "--format", "json"]).stdout)["hosts"]
    assert host["exit_bits"] == 2 and host["cannot_judge"] == [{"check_id": "probe", "detail": problem}]


def test_uncordon_goes_on_past_a_host_it_loses_and_reports_every_host_it_took_back(fleet, monkeypatch):
    from hosttune.remediate import cordon

    states, inv = fleet
    states.update({"gpu-01": CORDONED, "gpu-02": CORDONED, "gpu-03": CORDONED})

    def execute_step(survey, step, run, command):
        assert command == "uncordon"  # its journal is not an apply's: a plain rollback never undoes it
        if survey.host.name == "gpu-02":
            raise TransportError("gpu-02: connection refused (is sshd running, and on this port?)")
        return True, ""

    monkeypatch.setattr(cordon, "execute_step", execute_step)
    result = runner.invoke(app, ["uncordon", *inv, "--yes"])
    assert result.exit_code == 2 and "internal error" not in result.output, result.output
    done = [line for line in result.stdout.splitlines() if "uncordoned" in line]
    assert [line.split(":")[0] for line in done] == ["gpu-01", "gpu-02", "gpu-03"], result.stdout
    assert done[1] == "gpu-02: not uncordoned: gpu-02: connection refused (is sshd running, and on this port?)"


def test_a_real_run_that_finds_nothing_to_do_does_not_call_itself_a_dry_run(fleet):
    states, inv = fleet
    states.update({"gpu-01": SERVING, "gpu-02": SERVING, "gpu-03": SERVING})
    real = json.loads(runner.invoke(app, ["remediate", *inv, "--yes", "--format", "json"]).stdout)
    dry = json.loads(runner.invoke(app, ["remediate", *inv, "--yes", "--dry-run", "--format", "json"]).stdout)
    assert (real["run"], real["dry_run"]) == (None, False) and dry["dry_run"] is True


def test_the_ladder_line_marks_a_reboot_this_machine_would_skip_even_with_reboot():
    fault = Fault(FaultKind.REMAP_PENDING, "gpu.memory_health", (Rung.DRAIN, Rung.RESET, Rung.REBOOT, Rung.CORDON),
                  "GPU0: a row remap waits for a GPU reset", gpu=0)
    here = Survey(local_inventory().hosts[0], "inference-latency", snapshot=parse_snapshot(SERVING), faults=(fault,))
    plan = render.render_plan([planned(here)], LadderOptions(reboot=True)).splitlines()
    assert plan[2] == "    ladder: drain -> reset -> reboot (skipped: this machine runs hosttune) -> cordon"


def test_the_help_says_a_host_remediate_cannot_see_all_of_exits_2():
    """A fault check it cannot judge, or a part the probe could not read, sets bit 2 though nothing failed."""
    text = " ".join(runner.invoke(app, ["remediate", "--help"], env={"COLUMNS": "300"}).stdout.replace("│", " ").split())
    assert "2 an error, or a host remediate cannot see all of (a check its faults come from not judged" in text
