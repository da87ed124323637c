"""The remediation ladder as data: findings, facts and Xid history in; faults, ladders, steps and the
breaker's decisions out."""

import json
from dataclasses import replace

import pytest
from deploy_fixtures import ScriptedTransport, a100_facts, fake_entry, inventory
from typer.testing import CliRunner

from hosttune.actions.base import Command, FileWrite, describe
from hosttune.checks import run_checks
from hosttune.checks.xid_codes import Recovery, recovery
from hosttune.cli import app
from hosttune.config.profile import load_profile
from hosttune.deploy import rollout
from hosttune.deploy.host import deploy_one
from hosttune.deploy.state import parse_state
from hosttune.probes.facts import Facts, GpuFacts, GpuInfo
from hosttune.probes.machine import MachineIdentity
from hosttune.probes.facts_health import FabricManager, GpuHealth, HealthFacts, KernelLog, XidEvent
from hosttune.remediate.breaker import Breaker, BreakerError, BreakerPolicy
from hosttune.remediate.faults import FaultKind, find_faults
from hosttune.remediate.history import Ledger, LedgerError, Occurrence, observe, parse_ledger
from hosttune.remediate.rungs import Rung
from hosttune.remediate.state import Replica, parse_snapshot
from hosttune.remediate.steps import LadderOptions, restore_step, step_for
from hosttune.remediate.survey import Survey
from hosttune.remediate.xid import XidPolicy
from hosttune.remediate.xid import DIAGNOSE_LADDER, GPU_LADDER, LOG_LADDER, REBOOT_LADDER, RETIRE_LADDER, classify

PROFILE = load_profile("inference-latency")
NOW = 1_800_000_000.0
HOUR = 3600.0
GPU0, GPU1 = "0000:3b:00", "0000:86:00"
LB = "/opt/hosttune/releases/r1/.hosttune/replica_lb.py"
runner = CliRunner()
ID_A, ID_B = "0f5e3a11b2c64d7e8f9a0b1c2d3e4f50", "3d1219c7c4c5404aaa1f6d2a48adfda4"
UUID_A, UUID_B = "GPU-4b794de7-279f-721d-5fe5-8f6fcbfb3cf4", "GPU-8e0b2d7a-1c5f-4a6e-9d3b-2f7c1a0e5b94"


def ledger(*occurrences: tuple[str, int, float]) -> Ledger:
    return Ledger(xids=tuple(Occurrence(b, c, NOW - age) for b, c, age in occurrences))


def facts(*health: GpuHealth, events=(), **fm) -> Facts:
    gpus = (GpuInfo(0, "H200", GPU0 + ".0"), GpuInfo(1, "H200", GPU1 + ".0"))
    hv = HealthFacts(gpus=health or tuple(GpuHealth(g.index, g.bdf) for g in gpus), kernel_log=KernelLog("dmesg", tuple(events), len(events)),
                     uvm_loaded=True, device_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"),
                     fabric=FabricManager(**fm))
    return Facts(gpu=GpuFacts("nvidia-smi-xml", gpus, "580.1", pci_devices=tuple(g.bdf for g in gpus)), health=hv)


def snapshot(units=None, cordon="") -> str:
    replicas = {"replicas": [{"index": 0, "port": 8101, "gpus": [0]}, {"index": 1, "port": 8102, "gpus": [1]}]}
    units = units or {"hosttune-engine@0.service": "active", "hosttune-engine@1.service": "active"}
    lines = ["boot:b1/17", f"replicas:{json.dumps(replicas)}", f"lb:{LB}", *(f"unit:{u} {s}" for u, s in units.items())]
    return "\n".join(lines + ([f"cordon:{cordon}"] if cordon else [])) + "\n"


def faults_of(f: Facts, snap=None, led=Ledger()):
    snap = parse_snapshot(snap or snapshot())
    return find_faults(f, tuple(run_checks(f, PROFILE)), snap, led, NOW)


# -- Xid classification: NVIDIA's recovery action, then repeats within the window ------------------------


def test_recovery_actions_follow_nvidias_catalogue():
    assert recovery(13) is recovery(31) is Recovery.RESTART_APP
    assert recovery(79) is recovery(48) is recovery(119) is Recovery.RESET_GPU
    assert recovery(121) is Recovery.REBOOT and recovery(999) is Recovery.IGNORE


@pytest.mark.parametrize("history, ladder, words", [
    ([(GPU0, 13, 0)], LOG_LADDER, "once: an application fault"),
    ([(GPU0, 13, 2 * HOUR), (GPU0, 31, 0)], DIAGNOSE_LADDER, "2 times on this GPU"),
    ([(GPU0, 13, 2 * HOUR), (GPU1, 31, 0)], LOG_LADDER, "points at the software"),
    ([(GPU0, 79, 0)], GPU_LADDER, "Xid 79 (GPU has fallen off the bus)"),
    ([(GPU0, 121, 0)], REBOOT_LADDER, "Xid 121"),
    ([(GPU0, 48, h * HOUR) for h in (1, 5, 9, 13)] + [(GPU0, 79, 0)], RETIRE_LADDER, "5 fatal Xids in 24 h"),
    ([(GPU0, 48, h * HOUR) for h in (30, 40, 50, 60)] + [(GPU0, 79, 0)], GPU_LADDER, "Xid 79"),  # old ones are out of the window
    ([(GPU0, 999, 0)], LOG_LADDER, "informational"),
])
def test_xid_history_chooses_the_ladder(history, ladder, words):
    (verdict,) = [v for v in classify(ledger(*history), NOW) if v.bdf == GPU0]
    assert verdict.ladder == ladder and words in verdict.reason, verdict


def test_a_recovered_gpu_has_no_open_xid():
    led = ledger((GPU0, 79, HOUR)).with_recovered(GPU0, NOW - 60)
    assert classify(led, NOW) == []
    assert classify(replace(led, xids=led.xids + (Occurrence(GPU0, 79, NOW),)), NOW)[0].ladder == GPU_LADDER


def test_the_ledger_counts_each_kernel_log_line_once_per_boot():
    events = (XidEvent(GPU0, 13, "x"),)
    first = observe(Ledger(), "boot-a", events, NOW)
    assert [(o.bdf, o.code) for o in first.xids] == [(GPU0, 13)]
    assert observe(first, "boot-a", events, NOW + 60).xids == first.xids  # the same line, read again
    again = observe(first, "boot-a", events * 2, NOW + 60)
    assert len(again.xids) == 2 and again.xids[1].at == NOW + 60
    assert len(observe(first, "boot-b", events, NOW + 60).xids) == 2  # a new boot: its lines are new
    assert parse_ledger(again.to_json().decode()) == again
    with pytest.raises(LedgerError, match="move it aside"):
        parse_ledger("{not json")


def test_a_ledger_another_machine_kept_is_not_this_hosts_history():
    """A disk cloned from a host brings its ledger: that host's Xids would count as this one's repeats (four fatal
    Xids there and one here would retire this GPU). A ledger of another machine-id starts anew; one of an older
    hosttune, which recorded none, is kept."""
    theirs = replace(ledger(*[(GPU1, 48, h * HOUR) for h in range(4)]), machine=ID_A, gpus=(UUID_A,))
    event = (XidEvent(GPU1, 48, "x"),)
    here = observe(theirs, "boot-b", event, NOW, machine=MachineIdentity(ID_B, (UUID_B,)))
    assert [(o.bdf, o.code, o.at) for o in here.xids] == [(GPU1, 48, NOW)] and here.machine == ID_B
    assert len(observe(theirs, "boot-b", event, NOW, machine=MachineIdentity(ID_A)).xids) == 5
    assert len(observe(replace(theirs, machine=""), "boot-b", event, NOW, machine=MachineIdentity(ID_B)).xids) == 5
    assert parse_ledger(here.to_json().decode()) == here
    f = facts(GpuHealth(0, GPU0 + ".0"), GpuHealth(1, GPU1 + ".0"), events=event)
    assert faults_of(f, led=here)[0].ladder == GPU_LADDER  # not retired on the other machine's history


def test_a_machine_whose_id_is_made_anew_at_every_boot_keeps_its_ledger():
    """An image that writes a new /etc/machine-id at every boot is still this machine: its GPUs are the same, so the
    four fatal Xids of earlier boots and this one retire the GPU instead of starting a new history at each reboot."""
    before = replace(ledger(*[(GPU1, 48, h * HOUR) for h in range(4)]), machine=ID_A, gpus=(UUID_A, UUID_B))
    event = (XidEvent(GPU1, 48, "x"),)
    now = observe(before, "boot-b", event, NOW, machine=MachineIdentity(ID_B, (UUID_A, UUID_B)))
    assert len(now.xids) == 5 and now.machine == ID_B
    f = facts(GpuHealth(0, GPU0 + ".0"), GpuHealth(1, GPU1 + ".0"), events=event)
    assert faults_of(f, led=now)[0].ladder == RETIRE_LADDER


def test_the_ledger_is_kept_under_a_machine_id_only_where_it_lasts_past_the_boot():
    """systemd mounts a made-up id over an empty or 'uninitialized' /etc/machine-id it cannot write: such an id (and
    an uninitialised file) names no machine, so a ledger is neither set aside nor written under it."""
    from hosttune.probes.machine import identity

    gpus = GpuFacts(gpus=(GpuInfo(0, "H100", GPU0 + ".0", uuid=UUID_A),))
    transient = Facts(machine_id=ID_B, machine_id_transient=True, gpu=gpus)
    assert identity(transient) == MachineIdentity("", (UUID_A,))
    assert identity(replace(transient, machine_id="uninitialized", machine_id_transient=False)).machine_id == ""
    assert identity(replace(transient, machine_id_transient=False)).machine_id == ID_B
    before = replace(ledger((GPU1, 48, HOUR)), machine=ID_A)
    assert len(observe(before, "boot-b", (XidEvent(GPU1, 48, "x"),), NOW, identity(transient)).xids) == 2


# -- faults and their ladders ----------------------------------------------------------------------------


def test_a_healthy_host_has_no_fault():
    assert faults_of(facts()) == []


def test_a_stopped_replica_is_restarted_first():
    (fault,) = faults_of(facts(), snapshot({"hosttune-engine@0.service": "failed", "hosttune-engine@1.service": "active"}))
    assert (fault.kind, fault.unit, fault.ladder[0], fault.check_id) == (FaultKind.UNIT_DOWN, "hosttune-engine@0.service", Rung.RESTART, "serve.units")


def test_row_remap_pending_drains_and_resets_that_gpu():
    (fault,) = faults_of(facts(GpuHealth(0, GPU0 + ".0"), GpuHealth(1, GPU1 + ".0", remap_pending=True)))
    assert (fault.kind, fault.gpu, fault.ladder) == (FaultKind.REMAP_PENDING, 1, GPU_LADDER)


def test_xid_79_on_gpu1_and_remap_failure_on_gpu0():
    led = observe(Ledger(), "b1", (XidEvent(GPU1, 79, "fallen off the bus"),), NOW)
    f = facts(GpuHealth(0, GPU0 + ".0", remap_failure=True), GpuHealth(1, GPU1 + ".0"), events=(XidEvent(GPU1, 79, ""),))
    by_gpu = {x.gpu: x for x in faults_of(f, led=led)}
    assert by_gpu[1].kind is FaultKind.XID and by_gpu[1].ladder == GPU_LADDER and "GPU1" in by_gpu[1].reason
    assert by_gpu[0].kind is FaultKind.GPU_RETIRE and by_gpu[0].ladder == RETIRE_LADDER


def test_one_gpu_with_two_faults_climbs_the_ladder_that_reaches_furthest():
    led = ledger(*[(GPU1, 48, h * HOUR) for h in range(5)])
    f = facts(GpuHealth(0, GPU0 + ".0"), GpuHealth(1, GPU1 + ".0", remap_pending=True))
    (fault,) = faults_of(f, led=led)
    assert fault.gpu == 1 and fault.ladder == RETIRE_LADDER


def test_fabric_manager_down_restarts_it_and_a_missing_gpu_reboots():
    f = facts(nvswitches=4, active="failed", enabled="enabled")
    f = replace(f, gpu=replace(f.gpu, pci_devices=f.gpu.pci_devices + ("0000:c1:00.0",)))
    by_kind = {x.kind: x for x in faults_of(f)}
    assert by_kind[FaultKind.FABRIC_DOWN].unit == "nvidia-fabricmanager.service"
    assert by_kind[FaultKind.FABRIC_DOWN].ladder[0] is Rung.RESTART
    assert by_kind[FaultKind.GPU_MISSING].ladder == (Rung.REBOOT, Rung.CORDON)


def test_stuck_clocks_drain_and_reset():
    f = facts(GpuHealth(0, GPU0 + ".0", app_clock_mhz=900, app_clock_default_mhz=1980), GpuHealth(1, GPU1 + ".0"))
    (fault,) = faults_of(f)
    assert (fault.kind, fault.gpu, fault.ladder) == (FaultKind.CLOCKS_STUCK, 0, GPU_LADDER)


# -- rungs as operations ---------------------------------------------------------------------------------


def fault_on(gpu):
    return faults_of(facts(*(GpuHealth(i, b + ".0", remap_pending=i == gpu) for i, b in enumerate((GPU0, GPU1)))))[0]


def test_drain_takes_the_gpus_replica_out_waits_and_stops_it_each_undoable():
    snap = parse_snapshot(snapshot())
    step = step_for(Rung.DRAIN, fault_on(1), snap, LadderOptions(drain_wait_s=30))
    out, wait, stop = step.ops
    assert out.argv == ("python3", LB, "out", "1") and out.undo == ("python3", LB, "in", "1")
    assert wait.argv[-2:] == ("8102", "30") and "ss -Htn state established" in wait.argv[2]
    assert stop.argv == ("systemctl", "stop", "hosttune-engine@1.service") and stop.undo[:2] == ("systemctl", "start")
    start, healthy, back_in = restore_step(fault_on(1), snap, LadderOptions(restore_wait_s=90)).ops
    assert start.argv == ("systemctl", "start", "hosttune-engine@1.service") and back_in.argv == ("python3", LB, "in", "1")
    assert healthy.argv[-2:] == ("8102", "90") and "/health" in healthy.argv[2]


def test_reset_runs_only_on_an_idle_gpu_and_cordon_writes_the_state_file():
    snap = parse_snapshot(snapshot())
    (reset,) = step_for(Rung.RESET, fault_on(1), snap, LadderOptions()).ops
    assert reset.argv[-1] == "1" and "--query-compute-apps" in reset.argv[2] and 'nvidia-smi -r -i "$1"' in reset.argv[2]
    cordon = step_for(Rung.CORDON, fault_on(1), snap, LadderOptions(), run="R1", now=NOW)
    write, out0, out1 = cordon.ops
    assert isinstance(write, FileWrite) and write.path == "/var/lib/hosttune/cordon.json"
    assert json.loads(write.content) == {"at": NOW, "reason": "GPU1: a row remap waits for a GPU reset", "run": "R1"}
    assert out0.argv == ("python3", LB, "out", "0") and out1.undo == ("python3", LB, "in", "1")


def test_rungs_with_nothing_to_act_on_are_skipped():
    snap = parse_snapshot("boot:b\n")  # no replicas, no units
    assert step_for(Rung.DRAIN, fault_on(1), snap, LadderOptions()) is None
    assert step_for(Rung.RESTART, fault_on(1), snap, LadderOptions()) is None
    assert step_for(Rung.REBOOT, fault_on(1), snap, LadderOptions()) is None  # a reboot is not an operation list
    assert isinstance(step_for(Rung.RESET, fault_on(1), snap, LadderOptions()).ops[0], Command)


def test_a_cordoned_host_is_read_with_its_reason():
    snap = parse_snapshot(snapshot(cordon=json.dumps({"at": NOW, "reason": "GPU1: Xid 79", "run": "R"})))
    assert snap.cordon.reason == "GPU1: Xid 79" and snap.replicas_on(1) == (Replica(1, 8102, (1,)),)


# -- the circuit breaker ---------------------------------------------------------------------------------


def test_breaker_stops_at_its_percentage_across_four_hosts():
    b = Breaker(BreakerPolicy(max_cordoned_percent=50), 4, [], NOW)
    assert b.cordon("h1") == "" and b.cordon("h2") == ""
    why = b.cordon("h3")
    assert b.is_open and "3 of 4 hosts (75%)" in why and "--max-cordoned-percent 50" in why
    assert b.cordon("h4") == why  # open for every host


def test_breaker_default_and_window():
    assert Breaker(BreakerPolicy(), 4, [], NOW).cordon("h1")  # 1 of 4 is 25% > 10%
    assert Breaker(BreakerPolicy(), 20, [], NOW).cordon("h1") == ""  # 1 of 20 is 5%
    assert Breaker(BreakerPolicy(), 20, [NOW - 60], NOW).cordon("h2") == ""  # 2 of 20 is 10%
    assert Breaker(BreakerPolicy(), 20, [NOW - 60, NOW - 120], NOW).cordon("h3")  # 3 of 20
    assert Breaker(BreakerPolicy(), 20, [NOW - 2 * HOUR] * 5, NOW).cordon("h1") == ""  # older than the window
    with pytest.raises(BreakerError):
        BreakerPolicy(max_cordoned_percent=150)


# -- the command line ------------------------------------------------------------------------------------


def test_explain_documents_every_rung():
    for rung in Rung:
        result = runner.invoke(app, ["explain", f"remediate.{rung}"])
        assert result.exit_code == 0 and "does:" in result.stdout and "undo:" in result.stdout
    bad = runner.invoke(app, ["explain", "remediate.pray"])
    assert bad.exit_code == 2 and "unknown remediation step" in bad.stderr


def test_bad_breaker_setting_is_one_line():
    result = runner.invoke(app, ["remediate", "--max-cordoned-percent", "150", "--dry-run"])
    assert result.exit_code == 2 and "not between 0 and 100" in result.stderr and "Traceback" not in result.output


def test_deploy_refuses_a_cordoned_host_and_sends_nothing(tmp_path):
    state = parse_state('current:/opt/hosttune/releases/r1\ncordon:{"at": 1, "reason": "GPU1: Xid 79", "run": "R"}\nnginx:\n')
    assert state.cordoned == "cordoned (GPU1: Xid 79); hosttune uncordon takes it back"
    assert parse_state("current:\nnginx:\n").cordoned is None
    host = next(h for h in inventory(tmp_path).hosts if h.name == "gpu-a")
    fake_entry(tmp_path / "wh")
    job = rollout.make_job(host, a100_facts(), rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-1", tensor_parallel=2))
    log: list = []
    outcome = deploy_one(ScriptedTransport("gpu-a", log, state='cordon:{"at": 1, "reason": "GPU1: Xid 79"}\n'), job)
    assert outcome.state == "failed" and outcome.error == "nothing changed: gpu-a is cordoned (GPU1: Xid 79); hosttune uncordon takes it back"
    assert outcome.serving is None  # so the group's balancer, written over the hosts serving, leaves it out
    (only,) = log  # the state read, and nothing after it
    assert only[1][:2] == ("sh", "-c") and "hosttune deploy: what a host has now" in only[1][2]


def test_rollback_of_a_drain_starts_the_replica_and_puts_it_back_and_of_a_cordon_removes_the_file(tmp_path):
    from hosttune.execute.journal import start_journal
    from hosttune.execute.rollback import undo_list
    from hosttune.plan.host_plan import HostPlan

    snap = parse_snapshot(snapshot())
    host = inventory(tmp_path).hosts[0]
    steps = (step_for(Rung.DRAIN, fault_on(1), snap, LadderOptions()), step_for(Rung.CORDON, fault_on(1), snap, LadderOptions()))
    journal = start_journal("R-1", HostPlan(host, "p", steps=steps))
    journal = replace(journal, steps=tuple(replace(s, status="done", ops=tuple(replace(o, status="done") for o in s.ops))
                                           for s in journal.steps))
    undone = [u.argv or u.hostop for u in undo_list(journal)]
    assert ("python3", LB, "in", "1") in undone and ("systemctl", "start", "hosttune-engine@1.service") in undone
    assert ("remove", "/var/lib/hosttune/cordon.json") in undone


def test_units_a_failing_serve_units_finding_names_are_restarted_too():
    from hosttune.checks.findings import Finding, Severity, Status
    finding = Finding("serve.units", "t", Status.DRIFT, Severity.CRITICAL, "all active", None, "", "nginx.service is failed",
                      "", False, "", subjects=("nginx.service", "hosttune-engine@1.service"))
    snap = parse_snapshot(snapshot({"hosttune-engine@0.service": "active", "hosttune-engine@1.service": "failed"}))
    faults = find_faults(facts(), (finding,), snap, Ledger(), NOW)
    assert [(f.unit, f.ladder[0]) for f in faults] == [("hosttune-engine@1.service", Rung.RESTART), ("nginx.service", Rung.RESTART)]
    assert faults[1].reason == "nginx.service is not running (serve.units)"


def test_the_plan_as_json(tmp_path):
    from hosttune.remediate.climb import planned
    from hosttune.remediate.render import render_json
    from hosttune.remediate.survey import Survey

    survey = Survey(inventory(tmp_path).hosts[0], "p", snapshot=parse_snapshot(snapshot()), faults=(fault_on(1),))
    doc = json.loads(render_json([planned(survey)], None))
    (fault,) = doc["hosts"][0]["faults"]
    assert doc["dry_run"] and doc["hosts"][0]["exit_bits"] == 1
    assert (fault["kind"], fault["gpu"], fault["ladder"], fault["end"]) == ("remap-pending", 1, ["drain", "reset", "reboot", "cordon"], "planned")


def test_the_json_plan_carries_each_faults_first_step_as_the_text_plan_shows_it(tmp_path):
    from hosttune.remediate.climb import planned
    from hosttune.remediate.render import render_json, render_plan
    from hosttune.remediate.survey import Survey

    survey = Survey(inventory(tmp_path).hosts[0], "p", snapshot=parse_snapshot(snapshot()), faults=(fault_on(1),))
    options = LadderOptions()
    text = render_plan([planned(survey)], options).splitlines()
    (fault,) = json.loads(render_json([planned(survey)], None, options=options))["hosts"][0]["faults"]
    first = fault["first"]
    assert text[3] == f"    first: {first['summary']}" and first["reboot_skipped"] is None
    assert first["operations"] and [f"      {op}" for op in first["operations"]] == text[4:]


def test_a_host_without_replicas_stops_serving_when_cordoned_and_serves_again_when_uncordoned(tmp_path):
    """Its one service has no front to take it out of: after a reboot rung it runs again at boot, on the bad GPU."""
    from hosttune.remediate.cordon import uncordon_step
    from hosttune.remediate.survey import Survey

    single = parse_snapshot("boot:b1/17\nunit:hosttune-serve.service active\n")
    write, stop = step_for(Rung.CORDON, fault_on(1), single, LadderOptions(), run="R1", now=NOW).ops
    assert isinstance(write, FileWrite) and stop.argv == ("systemctl", "stop", "hosttune-serve.service")
    assert stop.undo == ("systemctl", "start", "hosttune-serve.service")  # rollback of the cordon serves again
    cordoned = parse_snapshot("boot:b1/17\nunit:hosttune-serve.service inactive\n"
                              f'cordon:{{"at": {NOW}, "reason": "GPU1: Xid 79"}}\n')
    start, removed = uncordon_step(Survey(inventory(tmp_path).hosts[0], "p", snapshot=cordoned)).ops
    assert removed.path == "/var/lib/hosttune/cordon.json" and start.argv == ("systemctl", "start", "hosttune-serve.service")


class ReplicaWorld:
    """One host whose replica hosttune-engine@0 (GPU0) keeps failing until GPU0 is reset: what each step does
    to it, and what a re-check reads back."""

    def __init__(self, host):
        self.host, self.gpu_ok, self.unit, self.steps = host, False, "failed", []

    def survey(self):
        snap = parse_snapshot(snapshot({"hosttune-engine@0.service": self.unit, "hosttune-engine@1.service": "active"}))
        return Survey(self.host, PROFILE.name, facts=facts(), snapshot=snap, faults=tuple(faults_of(facts(), snapshot(
            {"hosttune-engine@0.service": self.unit, "hosttune-engine@1.service": "active"}))))

    def execute(self, survey, step, run):
        self.steps.append(step.summary)
        for op in step.ops:
            verb = op.argv[:2]
            if verb in (("systemctl", "restart"), ("systemctl", "start")):
                self.unit = "active" if self.gpu_ok else "failed"
            elif verb == ("systemctl", "stop"):
                self.unit = "inactive"
            elif op.argv[:2] == ("sh", "-c") and op.argv[3] == "reset-gpu":
                self.gpu_ok = True
        return True, ""


def test_a_replica_that_runs_again_once_its_gpu_is_reset_is_cleared_by_the_reset_not_cordoned(tmp_path, monkeypatch):
    from hosttune.remediate import climb

    world = ReplicaWorld(inventory(tmp_path).hosts[0])
    monkeypatch.setattr(climb, "execute_step", world.execute)
    monkeypatch.setattr(climb, "survey_host", lambda host, profile, policy, ledger=None: world.survey())
    ctx = climb.Context({world.host.name: PROFILE}, LadderOptions(recheck_wait_s=0), XidPolicy(),
                        Breaker(BreakerPolicy(100.0), 1, [], NOW), "R")
    (result,) = climb.remediate_host(world.survey(), ctx).results
    assert result.end is climb.End.CLEARED, result
    assert [o.rung for o in result.rungs] == [Rung.RESTART, Rung.DRAIN, Rung.RESET, Rung.DRAIN]
    assert world.steps == ["restart hosttune-engine@0.service", "drain hosttune-engine@0.service off hosttune-engine@0.service",
                           "reset GPU 0", "restore hosttune-engine@0.service"]
    assert world.unit == "active" and "cordon the host" not in world.steps


def test_a_host_lost_mid_ladder_keeps_the_rungs_done_in_its_recap_with_their_runs(tmp_path, monkeypatch):
    """The drain's run id is how the operator puts the replica back: a lost connection must not drop it."""
    from hosttune.errors import TransportError
    from hosttune.remediate import climb

    world = ReplicaWorld(inventory(tmp_path).hosts[0])

    def execute(survey, step, run):
        if step.summary.startswith("reset"):
            raise TransportError("gpu-01: connection refused (is sshd running, and on this port?)")
        return world.execute(survey, step, run)

    monkeypatch.setattr(climb, "execute_step", execute)
    monkeypatch.setattr(climb, "survey_host", lambda host, profile, policy, ledger=None: world.survey())
    ctx = climb.Context({world.host.name: PROFILE}, LadderOptions(recheck_wait_s=0), XidPolicy(),
                        Breaker(BreakerPolicy(100.0), 1, [], NOW), "R")
    done = climb.remediate_host(world.survey(), ctx)
    assert done.error == "gpu-01: connection refused (is sshd running, and on this port?)" and done.exit_bits & 2
    (result,) = done.results
    assert [(o.rung, o.status, o.run) for o in result.rungs] == [
        (Rung.RESTART, "done", "R-1"), (Rung.DRAIN, "done", "R-2"), (Rung.RESET, "failed", "R-3")]
    assert result.end is climb.End.LEFT and result.leaves_drift


def test_a_ledger_whose_gpus_are_not_a_list_is_not_valid():
    doc = json.loads(replace(ledger((GPU1, 48, HOUR)), machine=ID_A, gpus=(UUID_A,)).to_json())
    with pytest.raises(LedgerError, match="move it aside"):
        parse_ledger(json.dumps({**doc, "gpus": UUID_A}))
