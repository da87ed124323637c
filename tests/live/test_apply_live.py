"""`hosttune apply` and `rollback` against real systemd hosts (nspawn containers) over real SSH."""
from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune import cores, cpulist
from hosttune.cli import app
from hosttune.errors import TransportError
from hosttune.execute.journal import Journal, journal_path, new_run_id
from hosttune.execute.runner import execute_plan
from hosttune.fleet_runner import EXIT_ERROR
from hosttune.config.inventory import load_inventory
from hosttune.plan.host_plan import PlanOptions, plan_host
from hosttune.probes.gather import gather
from hosttune.config.profile import profile_for
from hosttune.quoting import join
from hosttune.transport.base import with_become
from hosttune.transport.local import LocalTransport
from hosttune.transport.ssh import SshTransport

from .apply_setup import FAKE_DRIVER_PKG, HALTPOLL, UPDATE_GRUB, held, host_vars, make_untuned, snapshot, tree, unit_state, write
from .hosts import Bind

pytestmark = pytest.mark.live
runner = CliRunner()


def _auto_params() -> str:
    """The kernel parameters the latency playbook gives these containers: they share this machine's CPUs and idle driver."""
    facts = gather(LocalTransport()).facts
    cstates = "" if HALTPOLL else "intel_idle.max_cstate=1 processor.max_cstate=1 "
    return f"{cstates}rcu_nocbs={cpulist.format(cores.rcu_nocbs(facts, 'auto'))}"


def cstates(judged: str) -> str:
    """cpu.cstates on these containers: not-applicable on a haltpoll guest, else what the command line gives."""
    return "not-applicable" if HALTPOLL else judged


PARAMS = _auto_params()
QUIET = {"pins": {"python": "3.11"}, "tune": {"cuda": {"toolkit": None}}}  # fresh container: irqbalance is the only drift


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, (SystemExit, type(None))), result.exception
    return result.exit_code, result.stdout


def apply_json(inv: Path, *args: str) -> tuple[int, dict]:
    code, out = invoke("apply", "-i", str(inv), "--format", "json", *args)
    return code, json.loads(out)


def by_host(doc: dict) -> dict[str, dict]:
    return {h["host"]: h for h in doc["hosts"]}


def check(inv: Path) -> dict[str, dict[str, str]]:
    _, out = invoke("check", "-i", str(inv), "--format", "json")
    return {h["host"]: {f["check_id"]: f["status"] for f in h["findings"]} for h in json.loads(out)["hosts"]}


def journal(host, run: str) -> Journal:
    return Journal.from_json(host.path(journal_path(run)).read_text())


def inventory(live_fleet, tmp_path, hosts, vars_by_host) -> Path:
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", hosts)
    return live_fleet.write_inventory(tmp_path / "inv.yaml", known, hosts, host_vars=vars_by_host)


# -- 1: fix, idempotent, dry run, rollback, verify ---------------------------------------------


def test_apply_fixes_then_nothing_then_rollback_restores_byte_for_byte(fresh_hosts, live_fleet, tmp_path):
    (host,) = fresh_hosts(["tuneme"])
    make_untuned(host)
    inv = inventory(live_fleet, tmp_path, [host], {"tuneme": host_vars()})
    before, held_before = snapshot(host), held(host)

    code, _ = invoke("verify", "-i", str(inv))
    assert code != 0, "verify must fail on the untuned host"

    code, dry = apply_json(inv, "--dry-run")
    plan = by_host(dry)["tuneme"]["plan"]
    fixes = {c for step in plan["steps"] for c in step["fixes"]}
    assert fixes == {"driver.version", "driver.held", "cuda.toolkit", "gpu.persistence", "kernel.rcu_nocbs",
                     "irq.irqbalance", "numa.topology"} | (set() if HALTPOLL else {"cpu.cstates"})
    assert HALTPOLL is ("max_cstate" not in json.dumps(plan))  # no C-state limit proposed on a haltpoll guest
    assert "+kernel.numa_balancing = 0" in plan["diffs"]["/etc/sysctl.d/90-hosttune.conf"]
    assert snapshot(host) == before and held(host) == held_before
    assert not host.path("/var/lib/hosttune").exists()

    code, done = apply_json(inv, "--yes")
    result = by_host(done)["tuneme"]
    assert result["state"] == "changed" and result["changed"] == 7, result
    assert code & 1 and not code & EXIT_ERROR  # 1: reboot pending, driver.version cannot be met by a fake GPU
    assert unit_state(host, "irqbalance.service") == ("disabled", "inactive")
    assert unit_state(host, "nvidia-persistenced.service") == ("enabled", "active")
    assert {"hello", FAKE_DRIVER_PKG} <= held(host)
    assert host.exec("dpkg-query -W -f '${Version}' hello").stdout == "2.10-3"
    assert os.readlink(host.path("/usr/local/cuda")) == "/usr/local/cuda-12.4"
    assert f"quiet {PARAMS}\n" in host.path("/boot/grub/grub.cfg").read_text()
    assert "# kernel.numa_balancing = 1" in host.path("/etc/sysctl.d/95-site.conf").read_text()
    status = check(inv)["tuneme"]
    assert {k: status[k] for k in ("irq.irqbalance", "driver.held", "cuda.toolkit", "gpu.persistence", "numa.topology")} == dict.fromkeys(
        ("irq.irqbalance", "driver.held", "cuda.toolkit", "gpu.persistence", "numa.topology"), "ok")
    assert status["kernel.rcu_nocbs"] == "pending-reboot" and status["cpu.cstates"] == cstates("pending-reboot")
    record = journal(host, done["run"])
    assert record.status == "done" and all(s.status == "done" for s in record.steps)

    code, again = apply_json(inv, "--yes")
    assert by_host(again)["tuneme"]["state"] == "ok" and by_host(again)["tuneme"]["plan"]["steps"] == []
    assert again["run"] is None  # nothing to do: no run, no journal

    junit = tmp_path / "verify.xml"
    code, _ = invoke("verify", "-i", str(inv), "--junit-xml", str(junit))
    assert code == 0 and 'failures="0"' in junit.read_text() and "tuneme" in junit.read_text()

    code, out = invoke("rollback", "--yes", "-i", str(inv))
    assert code == 0 and "tuneme: restored" in out
    assert snapshot(host) == before  # every file byte for byte (and every link)
    assert held(host) == held_before
    assert unit_state(host, "irqbalance.service") == ("enabled", "inactive")
    assert unit_state(host, "nvidia-persistenced.service") == ("disabled", "inactive")
    assert journal(host, done["run"]).rolled_back


# -- 2: a live kernel write to a read-only kernel file ----------------------------------------


def test_read_only_kernel_write_is_a_failed_step_its_recap_says_what_changed_and_how_to_undo_it(fresh_hosts, live_fleet, tmp_path):
    bad, good = fresh_hosts(["rokernel", "okhost"])
    thp_always = {**QUIET, "tune": {**QUIET["tune"], "memory": {"thp": "always"}}}
    inv = inventory(live_fleet, tmp_path, [bad, good], {"rokernel": thp_always, "okhost": QUIET})
    before, units_before = snapshot(bad), unit_state(bad, "irqbalance.service")
    code, out = invoke("apply", "-i", str(inv), "--yes")
    assert code & EXIT_ERROR
    recap = out[out.index("recap (run "):]
    run = recap.split()[2].rstrip("):")
    assert "rokernel  failed      1 of 2 steps done, step 2 failed after 5 of its 6 operations" in recap, recap
    assert "live kernel write" in recap and "Read-only file system" in recap
    changed = next(line for line in recap.splitlines() if "changed before the failure:" in line)
    for change in ("disabled irqbalance.service", "created /etc/default/hosttune-thp",
                   "created /etc/systemd/system/hosttune-thp.service", "enabled hosttune-thp.service"):
        assert change in changed, changed
    undo = next(line for line in recap.splitlines() if "undo: " in line).split("undo: ", 1)[1]
    assert undo == f"hosttune rollback -i {inv} --limit rokernel --run {run} --yes"
    assert "okhost    changed" in recap  # the other host went on
    assert unit_state(good, "irqbalance.service")[0] == "disabled"

    record = journal(bad, run)
    assert record.status == "failed"
    irq_step, thp_step = record.steps
    assert irq_step.status == "done" and thp_step.status == "failed" and "Read-only file system" in thp_step.error
    assert [o.status for o in thp_step.ops] == ["done", "done", "done", "done", "done", "failed"]
    assert thp_step.ops[-1].kind == "kernel" and thp_step.is_live_kernel_write

    code, out = invoke(*shlex.split(undo)[1:])  # the recap's command, as a user would paste it
    assert code == 0, out
    assert "disable hosttune-thp.service again" in out and "stop hosttune-thp" not in out  # it never ran
    assert snapshot(bad) == before  # every file byte for byte, the unit's enablement link gone
    assert unit_state(bad, "irqbalance.service") == units_before
    assert not bad.path("/etc/systemd/system/hosttune-thp.service").exists()


# -- 3: the SSH connection dies in the middle of a file write ----------------------------------


class DroppedMidWrite(SshTransport):
    """Sends half of one file's new content, then kills the SSH session from the host's side."""

    def __init__(self, spec, live_host, path: str):
        super().__init__(spec)
        self.live_host, self.path, self.killed = live_host, path, False

    def _command(self, argv, stdin, timeout):
        if self.killed or "write" not in argv or self.path not in argv:
            return super()._command(argv, stdin, timeout)
        chan = self.connect().get_transport().open_session()
        chan.exec_command(join(with_become(argv, self.spec.become)))
        chan.sendall(stdin[: len(stdin) // 2])
        time.sleep(0.3)
        sessions = [line.split(None, 1)[0] for line in self.live_host.exec("ps -eo pid=,args=").stdout.splitlines()
                    if line.split(None, 1)[1].startswith("sshd: ") and "listener" not in line]
        self.live_host.exec(["kill", "-9", *sessions])
        self.killed = True
        deadline = time.monotonic() + 10
        while self._client.get_transport().is_active() and time.monotonic() < deadline:
            time.sleep(0.1)
        raise TransportError(f"{self.host_name}: connection lost while writing {self.path}")


SITE = "# site defaults\nvm.swappiness = 10\nkernel.numa_balancing = 1\n" + "# padding\n" * 200


def leftovers(host) -> list[str]:
    return host.exec("find /etc /usr/local -name '.hosttune-tmp.*'").stdout.split()


def test_killed_connection_leaves_no_partial_file_and_a_rerun_completes(fresh_hosts, live_fleet, tmp_path):
    (host,) = fresh_hosts(["dropme"])
    write(host, "/etc/sysctl.d/95-site.conf", SITE)
    inv = inventory(live_fleet, tmp_path, [host], {"dropme": QUIET})
    target = load_inventory(inv).hosts[0]
    plan = plan_host(target, profile_for(target), PlanOptions())
    assert [s.fixes for s in plan.steps] == [("irq.irqbalance",), ("numa.topology",)]
    run = new_run_id()
    with DroppedMidWrite(target.connection, host, "/etc/sysctl.d/95-site.conf") as transport:
        result = execute_plan(transport, plan, run)
    assert transport.killed and result.status == "failed" and "connection lost during step 2" in result.error

    assert host.path("/etc/sysctl.d/95-site.conf").read_text() == SITE  # old content, not half of the new
    assert host.path("/etc/sysctl.d/90-hosttune.conf").read_text().endswith("kernel.numa_balancing = 0\n")  # whole
    deadline = time.monotonic() + 10
    while leftovers(host) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(host) == []
    record = journal(host, run)
    assert record.status == "running" and [s.status for s in record.steps] == ["done", "running"]

    code, doc = apply_json(inv, "--yes")
    assert by_host(doc)["dropme"]["state"] == "changed", doc
    assert "# kernel.numa_balancing = 1" in host.path("/etc/sysctl.d/95-site.conf").read_text()
    code, doc = apply_json(inv, "--yes")
    assert by_host(doc)["dropme"]["state"] == "ok"


# -- 4: batches and the failure budget -------------------------------------------------------


def test_serial_and_max_fail_percent_with_one_failing_host(fresh_hosts, live_fleet, tmp_path):
    hosts = fresh_hosts(["failer", "second", "third"])
    thp_always = {**QUIET, "tune": {**QUIET["tune"], "memory": {"thp": "always"}}}
    inv = inventory(live_fleet, tmp_path, hosts, {"failer": thp_always, "second": QUIET, "third": QUIET})

    declined = runner.invoke(app, ["apply", "-i", str(inv)])  # shows the plan; no terminal to confirm on, no --yes
    assert declined.exit_code == EXIT_ERROR and "nothing changed: no terminal to confirm on" in declined.output
    assert "$ systemctl disable irqbalance.service" in declined.output
    assert all(unit_state(h, "irqbalance.service")[0] == "enabled" for h in hosts)

    code, doc = apply_json(inv, "--yes", "--serial", "1", "--max-fail-percent", "0")
    states = {h: v["state"] for h, v in by_host(doc).items()}
    assert states == {"failer": "failed", "second": "skipped", "third": "skipped"}
    assert code & EXIT_ERROR
    assert unit_state(hosts[1], "irqbalance.service")[0] == "enabled"  # skipped hosts were not touched

    code, doc = apply_json(inv, "--yes", "--serial", "2", "--max-fail-percent", "50")
    states = {h: v["state"] for h, v in by_host(doc).items()}
    assert states == {"failer": "failed", "second": "changed", "third": "changed"}  # 1 of 2 is not over 50%
    assert unit_state(hosts[2], "irqbalance.service")[0] == "disabled"


# -- 5: reboot pending hosts a batch at a time; pending until /proc/cmdline matches -------------


def grub_host(host) -> None:
    write(host, "/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    write(host, "/usr/sbin/update-grub", UPDATE_GRUB, 0o755)
    host.exec("update-grub")


def test_reboot_then_recheck_pending_until_cmdline_matches(fresh_hosts, live_fleet, tmp_path):
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(f"BOOT_IMAGE=/boot/vmlinuz root=/dev/vda1 ro quiet {PARAMS}\n")
    plain, booted = fresh_hosts(["rbplain", "rbcmdline"], binds={"rbcmdline": [Bind(cmdline, "/proc/cmdline", read_only=True)]})
    for h in (plain, booted):
        grub_host(h)
    inv = inventory(live_fleet, tmp_path, [plain, booted], {"rbplain": QUIET, "rbcmdline": QUIET})
    before = check(inv)["rbplain"]
    assert before["kernel.rcu_nocbs"] == "drift" and before["cpu.cstates"] == cstates("drift")

    code, doc = apply_json(inv, "--yes", "--serial", "1", "--reboot")
    hosts = by_host(doc)
    for name, h in (("rbplain", plain), ("rbcmdline", booted)):
        assert hosts[name]["state"] == "changed" and hosts[name]["rebooted"], hosts[name]
        assert h.machine.num_reboots == 1
    assert hosts["rbplain"]["recheck"]["kernel.rcu_nocbs"] == "pending-reboot"  # the container's kernel is the VM's
    assert hosts["rbcmdline"]["recheck"]["kernel.rcu_nocbs"] == "ok"  # /proc/cmdline has the parameters
    na = "not-applicable"  # the recheck lists only what applies
    assert hosts["rbplain"]["recheck"].get("cpu.cstates", na) == cstates("pending-reboot")
    assert hosts["rbcmdline"]["recheck"].get("cpu.cstates", na) == cstates("ok")


# -- 6: --root writes an image, never the running system; a minimal image over SSH --------------


def test_root_writes_under_the_root_and_skips_live_kernel_writes(fresh_hosts, live_fleet, tmp_path):
    (host,) = fresh_hosts(["baker"])
    host.exec("mkdir -p /srv/img/etc /srv/img/sbin && ln -s /lib/systemd/systemd /srv/img/sbin/init")  # boots systemd
    vars_ = {**QUIET, "tune": {**QUIET["tune"], "memory": {"thp": "always"}}}
    inv = inventory(live_fleet, tmp_path, [host], {"baker": vars_})
    live_before = snapshot(host)

    code, doc = apply_json(inv, "--yes", "--root", "/srv/img")
    result = by_host(doc)["baker"]
    assert result["state"] == "changed", result
    notes = [n for s in result["plan"]["steps"] for n in s["notes"]]
    assert any("--root: live kernel write skipped" in n for n in notes)
    img = host.path("/srv/img")
    assert (img / "etc/default/hosttune-thp").read_text().endswith("THP_MODE=always\n")
    assert (img / "etc/systemd/system/multi-user.target.wants/hosttune-thp.service").is_symlink()
    assert (img / "etc/sysctl.d/90-hosttune.conf").exists()
    assert (img / journal_path(doc["run"]).lstrip("/")).exists()
    after = snapshot(host)
    assert {k: v for k, v in after.items() if not k.startswith("/srv")} == live_before  # the running system untouched
    assert unit_state(host, "irqbalance.service")[0] == "enabled"

    code, out = invoke("rollback", "--yes", "-i", str(inv), "--root", "/srv/img")
    assert code == 0 and "restored" in out, out
    assert sorted(p.name for p in (img / "etc").iterdir()) == []  # every directory apply made is gone again
    a_minimal_image_over_ssh(host, live_fleet, tmp_path)


def a_minimal_image_over_ssh(host, live_fleet, tmp_path):
    """An image on the host with only etc/default/grub (no /usr/local, no update-grub, no shell): the dry run
    changes nothing, apply writes the kernel arguments, a second apply has nothing to do, rollback restores
    every byte."""
    write(host, "/srv/min/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inv = live_fleet.write_inventory(tmp_path / "min.yaml", known, [host], host_vars={host.name: {
        "rcu_nocbs": "2-31", "pins": {"cuda": "12.4", "python": "3.11"}}})
    image, before = host.path("/srv/min"), tree(host.path("/srv/min"))

    code, dry = apply_json(inv, "--dry-run", "--root", "/srv/min")
    plan = by_host(dry)[host.name]["plan"]
    assert by_host(dry)[host.name]["error"] is None and tree(image) == before, dry
    ops = [op["description"] for step in plan["steps"] for op in step["ops"]]
    assert "make directory /usr/local" in ops and "$ update-grub" not in ops, ops

    code, done = apply_json(inv, "--yes", "--root", "/srv/min")
    result = by_host(done)[host.name]
    assert result["state"] == "changed" and all(s["status"] == "done" for s in result["steps"]), result
    assert "rcu_nocbs=2-31" in (image / "etc/default/grub.d/90-hosttune.cfg").read_text()
    code, again = apply_json(inv, "--yes", "--root", "/srv/min")
    assert by_host(again)[host.name]["plan"]["steps"] == [] and again["run"] is None, again

    code, out = invoke("rollback", "--yes", "-i", str(inv), "--root", "/srv/min")
    assert code == 0 and "restored" in out, out
    assert {k: v for k, v in tree(image).items() if k not in ("/var", "/var/lib")} == before  # the journals' folder stays


# -- 7: rollback stops the boot units it removes ----------------------------------------------


def test_rollback_stops_a_boot_unit_that_ran_since_and_removes_it(fresh_hosts, live_fleet, tmp_path):
    thp = tmp_path / "thp"
    thp.mkdir()
    (thp / "enabled").write_text("always [madvise] never\n")
    (host,) = fresh_hosts(["unitstop"], binds={"unitstop": [Bind(thp, "/sys/kernel/mm/transparent_hugepage")]})
    inv = inventory(live_fleet, tmp_path, [host], {"unitstop": {**QUIET, "tune": {**QUIET["tune"], "memory": {"thp": "always"}}}})
    before = snapshot(host)

    code, doc = apply_json(inv, "--yes")
    assert by_host(doc)["unitstop"]["state"] == "changed", doc
    host.exec("systemctl start hosttune-thp.service")  # what every boot after the apply does
    assert unit_state(host, "hosttune-thp.service") == ("enabled", "active")

    code, out = invoke("rollback", "--yes", "-i", str(inv))
    assert code == 0 and "stop hosttune-thp.service" in out, out
    assert unit_state(host, "hosttune-thp.service")[1] == "inactive"
    assert snapshot(host) == before  # unit, script and defaults file gone, and the directories made for them
