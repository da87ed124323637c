"""The monitor as data: its profile section, apply's operations and rendered units, the host's monitor
section (recorded on a systemd host) and its checks, the status document, the metrics Prometheus reads,
the alert rules promtool accepts, and the status read `hosttune status` parses."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hosttune import __version__
from hosttune.actions import steps_for
from hosttune.actions.base import Command, Directory, FileWrite, Remove, Service
from hosttune.actions.units import DAEMON_RELOAD
from hosttune.actions.monitor import PROFILE_FILE, RULES_FILE, VENV, alert_rules, host_profile, monitor, timer_units
from hosttune.checks import BY_ID, run_checks
from hosttune.checks.findings import Status
from hosttune.checks.service_monitor import stale, version_fault
from hosttune.config.inventory import Host
from hosttune.config.profile import build, load_profile
from hosttune.errors import ProfileError
from hosttune.fleet import HostReport
from hosttune.probes.facts import Facts, GpuFacts, GpuInfo
from hosttune.probes.facts_health import HealthFacts, ShmFacts
from hosttune.probes.facts_serve import MonitorFacts
from hosttune.probes.monitor_state import parse_monitor
from hosttune.probes.sections import split
from hosttune.report import status_metrics
from hosttune.report.status_table import render_table
from hosttune.status import parse_read
from hosttune.status_file import StatusError, parse_status, status_doc, to_json
from hosttune.transport.base import ConnectionSpec, bundled_script
from wheels import make_wheel

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "serve" / "monitor-section.txt"
HOST = Host("h", "g", ConnectionSpec("h"))
SYSTEMD = Facts(hostname="gpu-01", pid1="systemd", os_id="debian", kernel="6.1.0",
                health=HealthFacts(shm=ShmFacts(1 << 24, 0, "tmpfs")))


@pytest.fixture
def wheels(tmp_path):
    make_wheel(tmp_path, "hosttune", __version__, ("typer>=0.12", 'aiohttp>=3.9; extra == "bench"'))
    make_wheel(tmp_path, "typer", "0.12.0", ("click>=8", 'colorama; platform_system == "Windows"'))
    make_wheel(tmp_path, "click", "8.1.7")
    return tmp_path


def monitored(wheels=None, **monitor):
    base = load_profile("inference-latency-monitored")
    return dataclasses.replace(base, monitor=dataclasses.replace(base.monitor, wheels=wheels and str(wheels), **monitor))


def test_the_latency_example_leaves_it_off_and_the_monitored_playbook_turns_it_on():
    assert not load_profile("inference-latency").monitor.enabled
    spec = load_profile("inference-latency-monitored").monitor
    assert spec.enabled and spec.interval_s == 60 and spec.active_interval_s == 3600


@pytest.mark.parametrize("values, message", [
    ({"interval_s": 5}, "monitor.interval_s: must be 10 to 604800 seconds"),
    ({"active_interval_s": 60}, "monitor.active_interval_s: must be 300 to"),
    ({"textfile_dir": "relative/dir"}, "monitor.textfile_dir: must be an absolute path"),
    ({"wheels": "/nonexistent/wheels"}, "monitor.wheels: /nonexistent/wheels is not a folder"),
])
def test_bad_monitor_settings_name_the_setting(values, message):
    with pytest.raises(ProfileError, match=message):
        build("p", {"monitor": values})


def test_a_wheel_folder_without_this_hosttune_is_refused(tmp_path):
    (tmp_path / "hosttune-0.0.1-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(ProfileError, match=f"has no hosttune-{__version__}-"):
        build("p", {"monitor": {"wheels": str(tmp_path)}})


@pytest.mark.parametrize("requires, missing", [
    (("typer>=0.12", "rich>=13"), f"hosttune-{__version__}-py3-none-any.whl needs rich>=13"),
    (("typer>=0.12; python_version >= '3.0'",), "typer-0.12.0-py3-none-any.whl needs shellingham>=1.3"),
])
def test_a_wheel_folder_without_a_dependency_is_refused_naming_it(tmp_path, requires, missing):
    """The host installs from the folder alone (pip --no-index): a dependency missing there failed pip in the middle
    of the apply. Markers that do not hold here (an extra, another platform) need no wheel."""
    make_wheel(tmp_path, "hosttune", __version__, (*requires, 'aiohttp; extra == "bench"'))
    make_wheel(tmp_path, "typer", "0.12.0", ("shellingham>=1.3", 'colorama; sys_platform == "win32"'))
    with pytest.raises(ProfileError) as caught:
        build("p", {"monitor": {"wheels": str(tmp_path)}})
    assert str(caught.value) == (f"monitor.wheels: {tmp_path} has no wheel of {missing.split(' needs ')[1]}, which "
                                 f"{missing.split(' needs ')[0]} needs; make the folder with "
                                 f"`pip wheel PATH-TO-HOSTTUNE -w {tmp_path}`")
    (tmp_path / f"hosttune-{__version__}-py3-none-any.whl").write_bytes(b"")  # not a zip: refused, not a traceback
    with pytest.raises(ProfileError, match="is not a wheel"):
        build("p", {"monitor": {"wheels": str(tmp_path)}})


def test_a_relative_wheel_folder_is_the_naming_files_not_the_working_directorys(wheels, tmp_path, monkeypatch):
    from hosttune.config.inventory import load_inventory
    from hosttune.config.profile import profile_for

    fleet = tmp_path / "fleet"
    (fleet / "playbooks").mkdir(parents=True)
    shutil.copytree(wheels, fleet / "wheels", ignore=shutil.ignore_patterns("fleet"))
    (fleet / "playbooks" / "mine.yaml").write_text(yaml.safe_dump({
        "name": "mine", "extends": "inference-latency", "settings": {"monitor": {"enabled": True, "wheels": "../wheels"}}}))
    (fleet / "hosts.yaml").write_text(yaml.safe_dump({"groups": {"g": {"hosts": {
        "a": {"address": "10.0.0.1", "profile": "playbooks/mine.yaml"},
        "b": {"address": "10.0.0.2", "profile": "playbooks/mine.yaml", "tune": {"monitor": {"wheels": "wheels"}}}}}}}))
    monkeypatch.chdir(tmp_path)  # not the inventory's folder
    a, b = load_inventory(fleet / "hosts.yaml").hosts
    assert Path(profile_for(a).monitor.wheels).resolve() == Path(profile_for(b).monitor.wheels).resolve() == \
        (fleet / "wheels").resolve()


def test_apply_uploads_the_wheels_makes_the_venv_and_starts_both_timers(wheels):
    (step,) = monitor(SYSTEMD, monitored(wheels), HOST)
    ops = step.ops
    uploads = [op for op in ops if isinstance(op, FileWrite) and op.source is not None]
    assert sorted(op.path.rsplit("/", 1)[1] for op in uploads) == sorted(p.name for p in wheels.glob("*.whl"))
    venv = next(op for op in ops if isinstance(op, Command) and "venv" in op.argv)
    assert venv.argv == ("python3", "-m", "venv", VENV) and venv.undo == ("rm", "-rf", "--", VENV)
    pip = next(op for op in ops if isinstance(op, Command) and "install" in op.argv)
    assert "--no-index" in pip.argv and pip.argv[-1] == f"hosttune=={__version__}"
    assert Directory("/var/lib/node_exporter/textfile_collector") in ops
    services = [op for op in ops if isinstance(op, Service)]
    assert services == [Service("hosttune-monitor.timer", True, True), Service("hosttune-monitor-active.timer", True, True)]
    assert ops.index(pip) < ops.index(services[0])
    assert {op.path for op in ops if isinstance(op, FileWrite)} >= {PROFILE_FILE, RULES_FILE}
    upgrade = dataclasses.replace(SYSTEMD, monitor=MonitorFacts(installed="0.0.9"))
    (again,) = monitor(upgrade, monitored(wheels), HOST)
    assert next(op for op in again.ops if isinstance(op, Command) and "venv" in op.argv).undo is None  # rollback keeps it


def test_the_monitors_install_needs_room_for_its_virtualenv_and_writes_only_there(wheels):
    """pip installs into the virtualenv with its temporary files there and no cache, as deploy's pip does: the space
    the plan checks for the virtualenv is where it writes, before anything is sent."""
    from hosttune.actions.needs import NeedSpace

    (step,) = monitor(SYSTEMD, monitored(wheels), HOST)
    pip = next(op for op in step.ops if isinstance(op, Command) and "install" in op.argv)
    assert pip.argv[:3] == ("env", f"TMPDIR={VENV}", f"{VENV}/bin/pip") and "--no-cache-dir" in pip.argv
    size = sum(w.stat().st_size for w in wheels.glob("*.whl"))
    assert NeedSpace(VENV, 3 * size) in pip.needs



    units = timer_units(monitored(interval_s=30, active_interval_s=1800, textfile_dir="/srv/textfile"))
    assert sorted(units) == ["hosttune-monitor-active.service", "hosttune-monitor-active.timer",
                             "hosttune-monitor.service", "hosttune-monitor.timer"]
    regular, active = units["hosttune-monitor.service"].decode(), units["hosttune-monitor-active.service"].decode()
    assert f"ExecStart={VENV}/bin/hosttune monitor --profile {PROFILE_FILE} --textfile-dir /srv/textfile\n" in regular
    assert "--textfile-dir /srv/textfile --active\n" in active and "TimeoutStartSec=900" in active
    assert "OnUnitActiveSec=30s" in units["hosttune-monitor.timer"].decode()
    assert "OnUnitActiveSec=1800s" in units["hosttune-monitor-active.timer"].decode()
    assert sorted(timer_units(monitored(active_interval_s=None))) == ["hosttune-monitor.service", "hosttune-monitor.timer"]


def test_the_host_profile_reads_back_as_the_same_desired_state(wheels, tmp_path):
    profile = monitored(wheels)
    path = tmp_path / "profile.yaml"
    path.write_bytes(host_profile(profile))
    again = load_profile(str(path))
    assert again.monitor == dataclasses.replace(profile.monitor, wheels=None)
    assert (again.cpu, again.irq, again.health, again.kernel) == (profile.cpu, profile.irq, profile.health, profile.kernel)


def test_without_wheels_the_step_is_blocked_saying_how_to_make_them():
    (step,) = monitor(SYSTEMD, monitored(), HOST)
    assert step.blocked.startswith("monitor.wheels is not set") and "pip wheel" in step.blocked and not step.ops


def test_the_recorded_monitor_section_parses_and_the_installed_monitor_is_ok():
    facts = parse_monitor(FIXTURE.read_text())
    assert facts.installed == "0.1.0" and facts.now == 1796418130 and facts.written["status.json"] == 1796418129
    timer = facts.timer("hosttune-monitor.timer")
    assert (timer.load, timer.active, timer.enabled, timer.interval) == ("loaded", "active", "enabled", "60s")
    host = dataclasses.replace(SYSTEMD, monitor=facts)
    installed = BY_ID["monitor.installed"].run(host, monitored())
    assert installed.status is Status.DRIFT and installed.detail == "hosttune-monitor-active.timer inactive, enabled"
    running = dataclasses.replace(facts, timers=tuple(dataclasses.replace(t, active="active") for t in facts.timers))
    assert BY_ID["monitor.installed"].run(dataclasses.replace(host, monitor=running), monitored()).status is Status.OK
    assert BY_ID["monitor.stale"].run(host, monitored()).status is Status.OK  # the active pass's first run is due
    assert BY_ID["monitor.installed"].run(host, load_profile("inference-latency")).status is Status.NOT_APPLICABLE


def test_another_version_or_interval_drifts_and_a_status_older_than_two_intervals_is_stale():
    facts = parse_monitor(FIXTURE.read_text())
    host = dataclasses.replace(SYSTEMD, monitor=dataclasses.replace(facts, installed="0.0.9"))
    finding = BY_ID["monitor.installed"].run(host, monitored(interval_s=30))
    assert "hosttune 0.0.9" in finding.detail and "hosttune-monitor.timer every 60s (wanted 30s)" in finding.detail
    later = dataclasses.replace(facts, now=facts.now + 2 * 60 + 300 + 1)
    stale_finding = BY_ID["monitor.stale"].run(dataclasses.replace(SYSTEMD, monitor=later), monitored())
    assert stale_finding.status is Status.DRIFT and stale_finding.subjects == ("hosttune-monitor.timer",)
    assert "regular pass last wrote its status 422s ago (every 60s)" in stale_finding.detail
    assert stale("hosttune-monitor.timer", 60, None, 10_000) == "the regular pass never wrote its status"
    assert BY_ID["monitor.stale"].run(dataclasses.replace(SYSTEMD, monitor=MonitorFacts()), monitored()).status \
        is Status.NOT_APPLICABLE


def _report() -> HostReport:
    facts = dataclasses.replace(SYSTEMD, monitor=parse_monitor(FIXTURE.read_text()))
    return HostReport(HOST, "inference-latency-monitored", True, facts, tuple(run_checks(facts, monitored())))


def test_the_status_document_round_trips_and_keeps_what_fails():
    report = _report()
    doc = status_doc(report, "regular", 60, 1796418130.5, 1.25, __version__)
    assert doc.host == "gpu-01" and doc.versions == {"hosttune": __version__, "driver": "", "kernel": "6.1.0", "release": ""}
    assert parse_status(to_json(doc)) == doc
    assert {f.check_id for f in doc.failing} >= {"monitor.installed"} and doc.counts["drift"] == len(doc.failing)
    with pytest.raises(StatusError, match="unreadable status file"):
        parse_status('{"host": "x"}')


def test_the_metrics_parse_and_pass_promtool():
    report = _report()
    text = status_metrics.render(report, status_doc(report, "regular", 60, 1796418130.5, 1.25, __version__))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    installed = {s.labels["status"]: s.value for s in families["hosttune_check_status"].samples
                 if s.labels["check"] == "monitor.installed"}
    assert installed["drift"] == 1.0 and sum(installed.values()) == 1.0
    assert families["hosttune_monitor_last_run_timestamp_seconds"].samples[0].value == 1796418130.5
    assert families["hosttune_info"].samples[0].labels["hosttune"] == __version__
    if shutil.which("promtool"):
        result = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
        assert result.returncode == 0, result.stderr


def test_the_alert_rules_pass_promtool_or_at_least_name_every_metric_they_use(tmp_path):
    rules = alert_rules(monitored())
    doc = yaml.safe_load(rules)
    alerts = {r["alert"]: r for r in doc["groups"][0]["rules"]}
    assert set(alerts) == {"HosttuneServiceDown", "HosttuneCriticalFinding", "HosttuneCheckError", "HosttuneProbeFailed",
                           "HosttuneMonitorStale", "HosttuneActivePassStale"}
    assert alerts["HosttuneMonitorStale"]["expr"].endswith("> 180") and alerts["HosttuneServiceDown"]["for"] == "120s"
    report = _report()
    names = {f.name for f in text_string_to_metric_families(
        status_metrics.render(report, status_doc(report, "regular", 60, 0.0, 0.0, __version__)))}
    for rule in alerts.values():
        assert {n for n in names if n in rule["expr"]}, rule["expr"]
    assert "HosttuneActivePassStale" not in alert_rules(monitored(active_interval_s=None)).decode()
    if shutil.which("promtool"):
        path = tmp_path / "rules.yml"
        path.write_bytes(rules)
        result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
        assert result.returncode == 0 and "SUCCESS: 6 rules found" in result.stdout, result.stdout + result.stderr


def _read_output(docs: dict[str, str], now: int) -> str:
    parts = [f"@@ht:now\n{now}\n@@ht-end:now:0"]
    for name in ("regular", "active"):
        parts.append(f"@@ht:{name}\n{docs[name]}\n@@ht-end:{name}:0" if name in docs else f"@@ht:{name}\n\n@@ht-end:{name}:3")
    return "\n".join(parts) + "\n"


def test_status_reads_the_passes_and_judges_staleness_on_the_hosts_clock():
    report = _report()
    regular = to_json(status_doc(report, "regular", 60, 1000.0, 1.0, __version__))
    fresh = parse_read(HOST, _read_output({"regular": regular}, 1100))
    assert fresh.age_s == 100.0 and not fresh.stale and fresh.findings and fresh.exit_bits == 1
    old = parse_read(HOST, _read_output({"regular": regular}, 1000 + 421))
    assert old.stale[0].check_id == "monitor.stale" and "421s ago" in old.stale[0].detail
    missing = parse_read(HOST, _read_output({}, 1100))
    assert missing.stale[0].detail.startswith("no status file")
    table = render_table([fresh, old, missing])
    assert table.splitlines()[0].split() == ["HOST", "STATE", "AGE", "HOSTTUNE", "DRIVER", "RELEASE", "FAILING"]
    assert "monitor.installed" in table and "STALE" in table and table.endswith("3 hosts: 1 drift, 2 stale")
    assert render_table([missing]).endswith("\n1 host: 1 stale")


def test_status_flags_a_monitor_of_another_hosttune_version_by_checks_own_rule():
    """The version column alone would leave a monitor that apply never upgraded reading ok."""
    report = _report()
    passed = dataclasses.replace(report, findings=())  # a pass that found nothing failing
    old = to_json(status_doc(passed, "regular", 60, 1000.0, 1.0, "0.0.9"))
    status = parse_read(HOST, _read_output({"regular": old}, 1100))
    (flag,) = status.findings
    assert (flag.check_id, flag.status, flag.severity) == ("monitor.installed", "drift", "warning")
    assert flag.detail == version_fault("0.0.9") == f"hosttune 0.0.9 (this controller runs {__version__})"
    assert status.exit_bits == 1 and render_table([status]).splitlines()[1].split()[1] == "DRIFT"
    facts = parse_monitor(FIXTURE.read_text())
    host = dataclasses.replace(SYSTEMD, monitor=dataclasses.replace(facts, installed="0.0.9"))
    assert version_fault("0.0.9") in BY_ID["monitor.installed"].run(host, monitored()).detail
    same = to_json(status_doc(passed, "regular", 60, 1000.0, 1.0, __version__))
    assert parse_read(HOST, _read_output({"regular": same}, 1100)).findings == ()


def test_the_monitor_step_comes_from_the_drifting_finding(wheels):
    facts = dataclasses.replace(SYSTEMD, monitor=parse_monitor(FIXTURE.read_text()))
    findings = run_checks(facts, monitored(wheels))
    steps = [s for s in steps_for(findings, facts, monitored(wheels), HOST) if "monitor.installed" in s.fixes]
    assert len(steps) == 1 and steps[0].ops


def _with(doc: str, **fields) -> str:
    """A status file as written, with some fields changed (as a broken writer, a clock jump or a hand edit leaves it)."""
    return json.dumps({**json.loads(doc), **fields})


def test_a_check_the_pass_could_not_judge_is_an_error_in_status_not_ok():
    report = _report()
    regular = _with(to_json(status_doc(report, "regular", 60, 1000.0, 1.0, __version__)), counts={"ok": 3, "error": 1},
                    findings=[{"check_id": "gpu.xid", "status": "error", "severity": "critical",
                               "detail": "cannot read the kernel log"}])
    host = parse_read(HOST, _read_output({"regular": regular}, 1100))
    assert host.exit_bits == 2 and [f.check_id for f in host.findings] == ["gpu.xid"]
    table = render_table([host])
    assert table.splitlines()[1].split()[:2] == ["h", "ERROR"] and "gpu.xid" in table
    assert "cannot judge: cannot read the kernel log" in table and table.endswith("1 host: 1 error")


@pytest.mark.parametrize("fields, why", [
    ({"when": float("nan")}, "when: must be a finite number of Unix seconds"),
    ({"when": "Infinity"}, "when: must be a finite number of Unix seconds"),
    ({"interval_s": 0}, "interval_s: must be 1 to 604800 seconds"),
    ({"interval_s": 1e30}, "interval_s: must be 1 to 604800 seconds"),  # it would never go stale
    ({"pass_name": "weekly"}, "pass_name: 'weekly', not 'regular' or 'active'"),
])
def test_a_status_file_whose_time_interval_or_pass_makes_no_sense_is_that_hosts_error(fields, why):
    regular = _with(to_json(status_doc(_report(), "regular", 60, 1000.0, 1.0, __version__)), **fields)
    with pytest.raises(StatusError, match=f"/var/lib/hosttune/monitor/status.json: .*{why}"):
        parse_read(HOST, _read_output({"regular": regular}, 1100))


def test_a_status_file_another_host_wrote_is_that_hosts_error_not_its_status():
    """A disk cloned from another host carries that host's status file: it says nothing of this one."""
    regular = to_json(status_doc(_report(), "regular", 60, 1000.0, 1.0, __version__))  # written on gpu-01
    output = _read_output({"regular": regular}, 1100)
    with pytest.raises(StatusError, match=r"^/var/lib/hosttune/monitor/status.json: written on gpu-01, not on this host "
                                          r"\(gpu-07\): a disk cloned from it\? its monitor pass rewrites it \(or remove it\)$"):
        parse_read(HOST, output + "@@ht:hostname\ngpu-07\n@@ht-end:hostname:0\n")
    assert parse_read(HOST, output + "@@ht:hostname\ngpu-01\n@@ht-end:hostname:0\n").docs
    anonymous = _with(regular, host="localhost")  # a pass whose probe failed knows no hostname
    assert parse_read(HOST, _read_output({"regular": anonymous}, 1100) + "@@ht:hostname\ngpu-07\n@@ht-end:hostname:0\n").docs


def test_a_status_file_another_machine_of_the_same_name_wrote_is_that_hosts_error():
    """A cloned disk whose clone kept the host name: the machine-id (where the clone was given its own) tells them
    apart. A file of an older monitor, which recorded none, is judged by the name alone."""
    ours, theirs = "3d1219c7c4c5404aaa1f6d2a48adfda4", "0f5e3a11b2c64d7e8f9a0b1c2d3e4f50"
    report = _report()
    report = dataclasses.replace(report, facts=dataclasses.replace(report.facts, machine_id=theirs))
    regular = to_json(status_doc(report, "regular", 60, 1000.0, 1.0, __version__))  # gpu-01, the original
    here = f"@@ht:hostname\ngpu-01\n@@ht-end:hostname:0\n@@ht:machine_id\n{ours}\n@@ht-end:machine_id:0\n"
    with pytest.raises(StatusError, match=rf"^/var/lib/hosttune/monitor/status.json: written on gpu-01 of machine-id "
                                          rf"{theirs}, not on this host \(gpu-01, machine-id {ours}\): a disk cloned "
                                          rf"from it\? its monitor pass rewrites it \(or remove it\)$"):
        parse_read(HOST, _read_output({"regular": regular}, 1100) + here)
    assert parse_read(HOST, _read_output({"regular": regular}, 1100) + here.replace(ours, theirs)).docs
    older = _with(regular)
    older = json.dumps({k: v for k, v in json.loads(older).items() if k != "machine_id"})
    assert parse_read(HOST, _read_output({"regular": older}, 1100) + here).docs


UUIDS = ("GPU-4b794de7-279f-721d-5fe5-8f6fcbfb3cf4", "GPU-8e0b2d7a-1c5f-4a6e-9d3b-2f7c1a0e5b94")


def _written_on(machine_id: str, *uuids: str) -> str:
    """The regular pass's status file as gpu-01 of this machine-id and these GPUs wrote it."""
    report = _report()
    gpus = GpuFacts(gpus=tuple(GpuInfo(i, "H100", f"0000:{i:02x}:00.0", uuid=u) for i, u in enumerate(uuids)))
    report = dataclasses.replace(report, facts=dataclasses.replace(report.facts, machine_id=machine_id,
                                                                   machine_id_transient=False, gpu=gpus))
    return to_json(status_doc(report, "regular", 60, 1000.0, 1.0, __version__))


def _here(machine_id: str, *uuids: str, store: str = "machine-id-fs:ext2/ext3") -> str:
    """status_read.sh's lines of the host it runs on."""
    return (f"@@ht:hostname\ngpu-01\n@@ht-end:hostname:0\n@@ht:machine_id\n{machine_id}\n@@ht-end:machine_id:0\n"
            f"@@ht:machine_id_store\n{store}\n@@ht-end:machine_id_store:0\n@@ht:gpus\n" + "".join(u + "\n" for u in uuids)
            + "@@ht-end:gpus:0\n")


def test_a_status_file_written_before_the_hosts_machine_id_was_made_anew_is_its_own():
    """An image that writes a new /etc/machine-id at every boot runs on the same GPUs: its last boot's status file is
    this host's, not a cloned disk's. A clone runs on another machine's GPUs, and is told so."""
    ours, theirs = "3d1219c7c4c5404aaa1f6d2a48adfda4", "0f5e3a11b2c64d7e8f9a0b1c2d3e4f50"
    regular = _read_output({"regular": _written_on(theirs, *UUIDS)}, 1100)
    assert parse_read(HOST, regular + _here(ours, *reversed(UUIDS))).docs
    with pytest.raises(StatusError, match=rf"written on gpu-01 of machine-id {theirs}, not on this host \(gpu-01, "
                                          rf"machine-id {ours}, and other GPUs\): a disk cloned from it\?"):
        parse_read(HOST, regular + _here(ours, "GPU-11111111-2222-3333-4444-555555555555"))


def test_a_machine_id_made_up_at_every_boot_names_no_machine_in_status():
    """An empty or 'uninitialized' /etc/machine-id that systemd cannot write gets a made-up id mounted over it at
    every boot: the status file of the boot before is this host's. An uninitialised file is no id either."""
    ours, theirs = "3d1219c7c4c5404aaa1f6d2a48adfda4", "0f5e3a11b2c64d7e8f9a0b1c2d3e4f50"
    regular = _read_output({"regular": _written_on(theirs)}, 1100)
    assert parse_read(HOST, regular + _here(ours, store="machine-id-mount:1\nmachine-id-fs:tmpfs")).docs
    assert parse_read(HOST, regular + _here(ours, store="machine-id-fs:tmpfs")).docs  # a tmpfs root
    assert parse_read(HOST, regular + _here("uninitialized")).docs
    report = _report()
    made_up = dataclasses.replace(report.facts, machine_id=ours, machine_id_transient=True)
    doc = status_doc(dataclasses.replace(report, facts=made_up), "regular", 60, 1000.0, 1.0, __version__)
    assert doc.machine_id == ""  # written under no id: the next boot's would differ


def test_the_probe_reads_where_the_machine_id_lives():
    from hosttune.probes.system import parse_meta

    meta = parse_meta("/etc/machine-id:3d1219c7c4c5404aaa1f6d2a48adfda4\nmachine-id-mount:1\nmachine-id-fs:tmpfs\n")
    assert meta["machine_id_transient"] is True
    assert parse_meta("/etc/machine-id:3d1219c7c4c5404aaa1f6d2a48adfda4\nmachine-id-fs:xfs\n")["machine_id_transient"] is False
    assert parse_meta("uid:0\n")["machine_id_transient"] is None  # an older probe's output: not read


@pytest.mark.parametrize("machine_id, transient, pid1, status, words", [
    ("3d1219c7c4c5404aaa1f6d2a48adfda4", False, "systemd", Status.OK, ""),
    ("3d1219c7c4c5404aaa1f6d2a48adfda4", True, "systemd", Status.DRIFT, "a new id at every boot"),
    ("uninitialized", False, "systemd", Status.DRIFT, "'uninitialized', not a machine-id"),
    ("", False, "systemd", Status.DRIFT, "is empty, not a machine-id"),
    ("", False, "tini", Status.NOT_APPLICABLE, "no /etc/machine-id: PID 1 is tini"),
    ("3d1219c7c4c5404aaa1f6d2a48adfda4", None, "systemd", Status.ERROR, "did not say where /etc/machine-id lives"),
])
def test_a_machine_id_made_anew_at_boot_is_a_finding(machine_id, transient, pid1, status, words):
    f = BY_ID["sys.machine_id"].run(Facts(machine_id=machine_id, machine_id_transient=transient, pid1=pid1),
                                    monitored())
    assert f.status is status and words in (f.detail or "") + (f.active or "")


def test_the_probe_reads_the_machine_id():
    from hosttune.probes.system import parse_meta

    meta = parse_meta("/proc/sys/kernel/hostname:gpu-01\n/etc/machine-id:3d1219c7c4c5404aaa1f6d2a48adfda4\nuid:0\n")
    assert meta["hostname"] == "gpu-01" and meta["machine_id"] == "3d1219c7c4c5404aaa1f6d2a48adfda4"
    assert parse_meta("uid:0\n")["machine_id"] == ""


def test_the_status_read_prints_the_hosts_name_beside_its_clock():
    output = subprocess.run(["sh", "-s"], input=bundled_script("hosttune", "status_read.sh"), capture_output=True,
                            text=True, check=True).stdout
    assert split(output)["hostname"].text.strip() == Path("/proc/sys/kernel/hostname").read_text().strip()
    machine_id = Path("/etc/machine-id")
    assert split(output)["machine_id"].text.strip() == (machine_id.read_text().strip() if machine_id.exists() else "")
    mounted = any(line.split()[4] == "/etc/machine-id" for line in Path("/proc/self/mountinfo").read_text().splitlines())
    assert ("machine-id-mount:1" in split(output)["machine_id_store"].text) == mounted
    assert "machine-id-fs:" in split(output)["machine_id_store"].text and "gpus" in split(output)


def test_the_active_pass_file_holding_the_regular_pass_is_that_hosts_error():
    regular = to_json(status_doc(_report(), "regular", 60, 1000.0, 1.0, __version__))
    with pytest.raises(StatusError, match="status-active.json: it holds the regular pass's status, not the active pass's"):
        parse_read(HOST, _read_output({"regular": regular, "active": regular}, 1100))


def test_a_status_written_ahead_of_the_hosts_clock_is_stale_not_fresh_forever():
    regular = to_json(status_doc(_report(), "regular", 60, 1_000_000.0, 1.0, __version__))
    host = parse_read(HOST, _read_output({"regular": regular}, 1000))
    assert host.stale and host.exit_bits & 1
    assert host.stale[0].detail == ("the regular pass's status is dated 999000s ahead of the host's clock "
                                    "(the clock was set back?): it cannot say when the pass last ran")
    ahead_by_a_little = parse_read(HOST, _read_output({"regular": regular}, 1_000_000 - 30))
    assert not ahead_by_a_little.stale  # a pass that ends while the clock is stepped back by NTP


def test_turning_the_active_pass_off_drifts_until_apply_stops_its_timer_and_removes_what_it_left(wheels):
    facts = parse_monitor(FIXTURE.read_text())  # both timers installed, the active one enabled
    host = dataclasses.replace(SYSTEMD, monitor=facts)
    off = monitored(active_interval_s=None)
    installed = BY_ID["monitor.installed"].run(host, off)
    assert installed.status is Status.DRIFT and installed.detail == (
        "hosttune-monitor-active.timer inactive, enabled, but monitor.active_interval_s is null")
    (step,) = monitor(host, dataclasses.replace(off, monitor=dataclasses.replace(off.monitor, wheels=str(wheels))), HOST)
    ops = step.ops
    stop = Service("hosttune-monitor-active.timer", enabled=False, running=False)
    removed = [op.path for op in ops if isinstance(op, Remove)]
    assert stop in ops and removed == ["/etc/systemd/system/hosttune-monitor-active.timer",
                                       "/etc/systemd/system/hosttune-monitor-active.service",
                                       "/var/lib/hosttune/monitor/status-active.json",
                                       "/var/lib/node_exporter/textfile_collector/hosttune-active.prom"]
    assert ops.index(stop) < ops.index(DAEMON_RELOAD) and ops.index(stop) < min(ops.index(Remove(p)) for p in removed)
    gone = dataclasses.replace(facts, timers=tuple(t for t in facts.timers if t.name == "hosttune-monitor.timer"))
    assert BY_ID["monitor.installed"].run(dataclasses.replace(host, monitor=gone), off).status is Status.OK
    (on,) = monitor(host, monitored(wheels), HOST)
    assert not [op for op in on.ops if isinstance(op, Remove)]


def _promtool_series(text: str, minutes: int) -> list[dict]:
    """A pass's metrics as promtool's input series: the same pass written every minute (its time moving on)."""
    series = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            moving = s.name == "hosttune_monitor_last_run_timestamp_seconds"
            series.append({"series": f"{s.name}{{{labels}}}", "values": f"0+60x{minutes}" if moving else f"{s.value:g}x{minutes}"})
    return series


def test_a_pass_whose_probe_fails_every_time_fires_an_alert_not_silence(tmp_path):
    """A hung probe (a GPU off the bus hangs nvidia-smi) leaves no check series at all, and a fresh timestamp."""
    alerts = {r["alert"]: r for r in yaml.safe_load(alert_rules(monitored()))["groups"][0]["rules"]}
    assert "hosttune_monitor_probe_ok" in alerts["HosttuneProbeFailed"]["expr"]
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    failed = HostReport(HOST, "inference-latency-monitored", True, error="probe timed out after 60s")
    metrics = status_metrics.render(failed, status_doc(failed, "regular", 60, 0.0, 60.0, __version__))
    (tmp_path / "rules.yml").write_bytes(alert_rules(monitored()))
    fired = {"exp_labels": {"host": "h", "pass": "regular", "severity": "critical"},
             "exp_annotations": {"summary": "hosttune's regular pass cannot probe h",
                                 "description": alerts["HosttuneProbeFailed"]["annotations"]["description"]}}
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": _promtool_series(metrics, 10),
        "alert_rule_test": [{"eval_time": "1m", "alertname": "HosttuneProbeFailed", "exp_alerts": []},
                            {"eval_time": "5m", "alertname": "HosttuneProbeFailed", "exp_alerts": [fired]},
                            {"eval_time": "5m", "alertname": "HosttuneMonitorStale", "exp_alerts": []}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_finds_a_status_file_dated_ahead_of_the_hosts_clock_stale_too():
    facts = parse_monitor(FIXTURE.read_text())
    ahead = dataclasses.replace(facts, now=facts.now - 10_000)  # the clock set back after the last pass
    finding = BY_ID["monitor.stale"].run(dataclasses.replace(SYSTEMD, monitor=ahead), monitored())
    assert finding.status is Status.DRIFT and finding.subjects == ("hosttune-monitor.timer",)
    assert finding.detail == ("the regular pass's status is dated 9999s ahead of the host's clock "
                              "(the clock was set back?): it cannot say when the pass last ran")


def test_a_host_whose_active_pass_wrote_but_regular_pass_never_did_says_so_and_judges_the_active_one():
    active = to_json(status_doc(_report(), "active", 3600, 1000.0, 1.0, __version__))
    host = parse_read(HOST, _read_output({"active": active}, 1000 + 2 * 3600 + 900 + 1))
    assert [f.detail for f in host.stale] == [
        "the regular pass never wrote its status, though the active pass did: systemctl status hosttune-monitor.timer",
        "the active pass last wrote its status 8101s ago (every 3600s)"]


def test_a_pass_whose_probe_could_not_read_part_of_the_host_is_an_error_in_status_and_metrics_not_ok():
    """The pass exits 2 on a probe error (a section it could not parse): its status file and metrics must say so too."""
    report = _report()
    problem = "gpu: NVIDIA devices on the PCI bus but no driver answered: nvidia-smi exited 9"
    broken = dataclasses.replace(report, facts=dataclasses.replace(report.facts, probe_errors=(problem,)))
    assert broken.exit_bits & 2
    doc = status_doc(broken, "regular", 60, 1000.0, 1.0, __version__)
    assert doc.error == problem and doc.findings == status_doc(report, "regular", 60, 1000.0, 1.0, __version__).findings
    host = parse_read(HOST, _read_output({"regular": to_json(doc)}, 1100))
    assert host.exit_bits & 2 and f"regular pass: probe failed: {problem}" in render_table([host])
    assert 'hosttune_monitor_probe_ok{host="gpu-01",pass="regular"} 0' in status_metrics.render(broken, doc)


@pytest.mark.parametrize("gpus", ["GPU-4b794de7-279f-721d-5fe5-8f6fcbfb3cf4", {"a": 1}, 7])
def test_a_status_file_whose_gpus_are_not_a_list_is_unreadable(gpus):
    """A text would read as one GPU per character, and match nothing: the file is broken, not another machine's."""
    regular = _with(to_json(status_doc(_report(), "regular", 60, 1000.0, 1.0, __version__)), gpus=gpus)
    with pytest.raises(StatusError, match="gpus: must be a list of GPU UUIDs"):
        parse_status(regular)


def test_a_machine_id_mounted_over_the_file_is_read_as_made_up_at_boot(tmp_path):
    """What systemd does where /etc/machine-id is empty or 'uninitialized' and cannot be written, in a mount
    namespace of this test's own: the status read and the probe both see the mount, and name no machine by it."""
    from hosttune.probes.gather import parse_probe_output, probe_script
    from hosttune.status import read_identity

    if os.geteuid() != 0 or not shutil.which("unshare") or not Path("/etc/machine-id").exists():
        pytest.skip("needs root, unshare and /etc/machine-id")
    made_up = tmp_path / "machine-id"
    made_up.write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "probe.sh").write_bytes(probe_script(0))
    (tmp_path / "status_read.sh").write_text(bundled_script("hosttune", "status_read.sh"))
    script = (f"mount --bind {made_up} /etc/machine-id && sh {tmp_path / 'status_read.sh'} && echo @@probe && "
              f"sh {tmp_path / 'probe.sh'}")
    run = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True)
    if run.returncode != 0:
        pytest.skip(f"no mount namespace here: {run.stderr.strip()[:200]}")
    status, probe = run.stdout.split("@@probe\n", 1)
    assert read_identity(split(status)).machine.machine_id == ""
    facts = parse_probe_output(probe)
    assert facts.machine_id == "0123456789abcdef0123456789abcdef" and facts.machine_id_transient is True
    assert BY_ID["sys.machine_id"].run(facts, monitored()).status is Status.DRIFT


def test_the_machine_id_fix_is_said_once_in_the_plan():
    """The plan says apply does not fix it; the remediation says how, without saying so again."""
    from hosttune.actions import steps_for as plan_steps

    made_up = Facts(machine_id="0123456789abcdef0123456789abcdef", machine_id_transient=True, pid1="systemd")
    finding = BY_ID["sys.machine_id"].run(made_up, monitored())
    (step,) = [s for s in plan_steps([finding], made_up, monitored(), HOST) if "sys.machine_id" in s.fixes]
    assert step.blocked.startswith("no automatic fix: systemd-machine-id-setup --commit") and "apply" not in step.blocked
