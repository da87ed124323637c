"""`hosttune remediate` on real systemd hosts over SSH, GPU faults injected through stand-ins.

Each host carries the stand-in GPUs of gpu_standin.py (two H200s from the recorded XML, `nvidia-smi -r`
that clears a GPU, fails as a lost GPU does or loses it, `dmesg` with a test's Xid lines, `dcgmi`) and two
replicas behind the host front's replica_lb.py (units and an nginx that only sleep: the drains, resets and
cordons act on their real systemd units and the real servers file).

- a stopped engine unit is restarted;
- Xid 13 once is logged in the host's ledger and nothing else changes; twice on one GPU, that GPU is
  drained, diagnosed (a stand-in `dcgmi` that passes) and its replica restored;
- a pending row remap on GPU 1 drains that GPU's replica, resets the GPU and restores the replica;
- Xid 79 on GPU 1 with a reset that cannot clear it: drained, reset attempted, host cordoned;
  `hosttune deploy` of the bundled engine is refused with the cordon's one line and installs nothing;
  `hosttune uncordon` takes the host back, and the same deploy then plans (a dry run);
- with the breaker at 0% the cordon is refused and the GPU stays drained; `hosttune rollback --run`
  of the drain's run starts its replica and puts it back into the front;
- a GPU on PCI that NVML lost (a stand-in sysfs): the host is rebooted (apply's reboot, waited for),
  the GPU is still missing, the host is cordoned;
- across 4 hosts with the same fault, the circuit breaker stops at its percentage.
The four hosts boot once for the module; the reboot test boots its own, with the sysfs stand-in.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.deploy.replicas import lb_script

from .deploy_setup import MODEL, free_port, invoke_deploy
from .gpu_standin import STANDIN, XID_13, XID_79, gpu_files, resets, set_faults, two_gpus, write_files
from .hosts import Bind

pytestmark = pytest.mark.live
runner = CliRunner()
NAMES = ["rem1", "rem2", "rem3", "rem4"]
META = "/opt/hosttune/releases/r1/.hosttune"
SERVERS = "/etc/hosttune/nginx/local-servers.conf"


def install(host, ports: tuple[int, int]) -> None:
    """GPU stand-ins and two replicas behind replica_lb.py, in the live release's layout."""
    files = {
        **gpu_files(),
        "/usr/local/sbin/nginx": ("#!/bin/sh\nexit 0\n", 0o755),  # `nginx -t` of replica_lb.py's sync
        f"{META}/replica_lb.py": (lb_script().decode(), 0o644),
        f"{META}/replicas.json": (json.dumps({
            "replicas": [{"index": i, "port": p, "gpus": [i], "numa_nodes": [0]} for i, p in enumerate(ports)],
            "servers_file": SERVERS, "state_dir": "/var/lib/hosttune/replicas", "max_fails": 1, "fail_timeout_s": 5,
            "probe_timeout_s": 5}), 0o644),
        # a replica that answers /health (a file of that name in the folder it serves), on its port from replicas.json
        "/var/lib/standin-replica/health": ("ok\n", 0o644),
        "/etc/systemd/system/hosttune-engine@.service": (
            "[Service]\nWorkingDirectory=/var/lib/standin-replica\nExecStart=/bin/sh -c 'exec python3 -m http.server "
            "\"$$(cat /etc/standin-replica-%i.port)\" --bind 127.0.0.1'\n[Install]\nWantedBy=multi-user.target\n", 0o644),
        "/etc/systemd/system/nginx.service": ("[Service]\nExecStart=/bin/sleep infinity\nExecReload=/bin/true\n"
                                             "[Install]\nWantedBy=multi-user.target\n", 0o644),
    }
    files.update({f"/etc/standin-replica-{i}.port": (f"{p}\n", 0o644) for i, p in enumerate(ports)})
    write_files(host, files)
    host.exec("ln -sfn /opt/hosttune/releases/r1 /opt/hosttune/current && systemctl daemon-reload "
              "&& systemctl enable --quiet nginx hosttune-engine@0 hosttune-engine@1 && systemctl start nginx")


def healthy(host, *, smi: str | None = None, dmesg: str = "", reset_fails: bool = False, reset_loses: bool = False) -> None:
    """The host as a test starts it: both replicas serving, no cordon, no ledger, the faults asked for."""
    host.exec("rm -rf /var/lib/hosttune/cordon.json /var/lib/hosttune/remediate /var/lib/hosttune/runs")
    set_faults(host, smi=smi, dmesg=dmesg, reset_fails=reset_fails, reset_loses=reset_loses)
    host.exec(f"systemctl start hosttune-engine@0 hosttune-engine@1 && python3 {META}/replica_lb.py in 0 >/dev/null "
              f"&& python3 {META}/replica_lb.py in 1 >/dev/null")


def down(host) -> list[bool]:
    """Whether each replica is out of the host's front (the servers file nginx reads)."""
    return [line.endswith(" down;") for line in host.exec(f"cat {SERVERS}").stdout.splitlines() if line.startswith("server ")]


def active(host, unit: str) -> str:
    return host.exec(f"systemctl is-active {unit}", check=False).stdout.strip()


def remediate(inventory: Path, *extra: str):
    result = runner.invoke(app, ["remediate", "-i", str(inventory), "--yes", "--drain-wait", "5", *extra])
    return result


@pytest.fixture(scope="module")
def fleet(live_fleet, tmp_path_factory):
    hosts = live_fleet.boot(NAMES)
    base = free_port(8)
    ports = iter(range(base, base + 8))
    for host in hosts:
        install(host, (next(ports), next(ports)))
    d = tmp_path_factory.mktemp("remediate")
    known = live_fleet.write_known_hosts(d / "known_hosts", hosts)
    one = live_fleet.write_inventory(d / "one.yaml", known, hosts[:1])
    four = live_fleet.write_inventory(d / "four.yaml", known, hosts)
    yield hosts, one, four
    for host in hosts:
        live_fleet.remove(host)


def test_a_stopped_engine_unit_is_restarted(fleet):
    (host, *_), one, _ = fleet
    healthy(host)
    host.exec("systemctl stop hosttune-engine@0")
    result = remediate(one)
    assert result.exit_code == 0, result.output
    assert "hosttune-engine@0.service is inactive" in result.stdout and "first: restart hosttune-engine@0.service" in result.stdout
    assert "  serve.units  hosttune-engine@0.service: cleared" in result.stdout and "restart: done" in result.stdout
    assert active(host, "hosttune-engine@0") == "active" and down(host) == [False, False]


def test_xid_13_once_is_logged_and_nothing_else_changes(fleet):
    (host, *_), one, _ = fleet
    healthy(host, dmesg=XID_13)
    result = remediate(one)
    assert result.exit_code == 0, result.output
    assert "GPU0: Xid 13 (graphics engine exception (usually an application bug)) once: an application fault, logged" in result.stdout
    assert "  gpu.xid  GPU0: logged" in result.stdout
    ledger = json.loads(host.path("/var/lib/hosttune/remediate/ledger.json").read_text())
    assert [(o["bdf"], o["code"]) for o in ledger["xids"]] == [("0000:3b:00", 13)]
    assert host.exec("ls /var/lib/hosttune/runs 2>/dev/null | wc -l").stdout.strip() == "0"  # no step ran
    assert down(host) == [False, False] and active(host, "hosttune-engine@0") == "active"
    again = remediate(one)
    assert again.exit_code == 0 and "rem1: ok, nothing to remediate" in again.stdout  # logged once, not again


def test_xid_13_twice_on_one_gpu_runs_its_diagnostics_then_restores_it(fleet):
    (host, *_), one, _ = fleet
    healthy(host, dmesg=XID_13 + XID_13.replace("1822.334410", "2301.001822"))
    result = remediate(one)
    assert result.exit_code == 0, result.output
    assert "2 times on this GPU: run its diagnostics" in result.stdout
    lines = result.stdout[result.stdout.index("remediation run"):].splitlines()
    assert [l.split(":")[0].strip() for l in lines if l.startswith("    ")] == ["drain", "diagnose", "drain"]
    assert "gpu.xid  GPU0: cleared" in result.stdout and "    drain: restored" in result.stdout
    assert host.exec(f"cat {STANDIN}/diags").stdout.split() == ["diag", "-r", "2", "-i", "0"]
    assert down(host) == [False, False] and active(host, "hosttune-engine@0") == "active"


def test_row_remap_pending_drains_and_resets_the_gpu_then_restores_its_replica(fleet):
    (host, *_), one, _ = fleet
    healthy(host, smi=two_gpus(remap_pending_on=1))
    result = remediate(one)
    assert result.exit_code == 0, result.output
    assert "GPU1: a row remap waits for a GPU reset" in result.stdout
    assert "first: drain hosttune-engine@1.service off GPU1" in result.stdout
    lines = result.stdout[result.stdout.index("remediation run"):].splitlines()
    assert [l.split(":")[0].strip() for l in lines if l.startswith("    ")] == ["drain", "reset", "drain"]
    assert "    drain: restored" in result.stdout and "gpu.memory_health  GPU1: cleared" in result.stdout
    assert resets(host) == ["1"]
    assert down(host) == [False, False] and active(host, "hosttune-engine@1") == "active"


def deploy(inventory: Path, wheelhouse: Path, *extra: str):
    """`hosttune deploy` of two CPU replicas of the bundled engine on the tiny model."""
    return invoke_deploy("deploy", "-i", str(inventory), "-w", str(wheelhouse), "--engine", "custom", "--model", MODEL,
                         "--replicas", "2", "--port", str(free_port(3)), "--set", "device=cpu", *extra)


def test_xid_79_drains_attempts_a_reset_then_cordons_and_deploy_refuses(fleet, wheelhouse, tiny_model):
    (host, *_), one, _ = fleet
    shutil.copytree(tiny_model, host.path(MODEL), dirs_exist_ok=True)
    healthy(host, dmesg=XID_79, reset_fails=True)
    result = remediate(one, "--max-cordoned-percent", "100")
    assert result.exit_code == 1, result.output
    assert "GPU1: Xid 79 (GPU has fallen off the bus)" in result.stdout
    assert "    drain: done" in result.stdout and "    reset: failed" in result.stdout and "the GPU is lost" in result.stdout
    assert "    reboot: skipped: --reboot not given" in result.stdout and "    cordon: done" in result.stdout
    assert "gpu.xid  GPU1: cordoned" in result.stdout
    assert resets(host) == ["1"]
    cordon = json.loads(host.path("/var/lib/hosttune/cordon.json").read_text())
    assert "Xid 79" in cordon["reason"]
    assert down(host) == [True, True] and active(host, "hosttune-engine@1") == "inactive"

    refused = deploy(one, wheelhouse, "--yes")
    assert refused.exit_code == 2, refused.output
    (line,) = [l for l in refused.stdout.splitlines() if l.startswith("rem1 ")]
    name, state, release, error = line.split(None, 3)
    assert (state, release) == ("failed", "-")
    assert error == "nothing changed: rem1 is cordoned (GPU1: Xid 79 (GPU has fallen off the bus)); hosttune uncordon takes it back"
    assert host.exec("readlink /opt/hosttune/current").stdout.strip() == "/opt/hosttune/releases/r1"  # nothing installed
    again = remediate(one)
    assert again.exit_code == 1 and "rem1: cordoned since" in again.stdout  # no ladder on a cordoned host

    back = runner.invoke(app, ["uncordon", "-i", str(one), "--yes"])
    assert back.exit_code == 0, back.output
    assert "rem1: uncordoned" in back.stdout and not host.path("/var/lib/hosttune/cordon.json").exists()
    assert down(host) == [False, False] and active(host, "hosttune-engine@1") == "active"
    plan = deploy(one, wheelhouse, "--dry-run")  # the same deploy, planned now
    assert plan.exit_code == 0, plan.output
    assert "plan: deploy to 1 of 1 host" in plan.output and "cordon" not in plan.output
    assert [l.split()[1] for l in plan.plan.splitlines() if l.startswith("rem1 ")] == ["planned"]


def test_a_reset_that_exits_0_but_loses_the_gpu_does_not_count_as_fixed(fleet):
    (host, *_), one, _ = fleet
    healthy(host, dmesg=XID_79, reset_loses=True)
    result = remediate(one, "--max-cordoned-percent", "100")
    assert result.exit_code == 1, result.output
    assert "    reset: done" in result.stdout and "    cordon: done" in result.stdout and "gpu.xid  GPU1: cordoned" in result.stdout
    assert down(host) == [True, True]


def test_a_breaker_at_0_percent_leaves_the_gpu_drained_and_rollback_restores_its_replica(fleet):
    (host, *_), one, _ = fleet
    healthy(host, dmesg=XID_79, reset_fails=True)
    result = remediate(one, "--max-cordoned-percent", "0", "--format", "json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    (fault,) = doc["hosts"][0]["faults"]
    assert doc["breaker"].startswith("circuit breaker open") and fault["end"] == "stopped" and fault["gpu"] == 1
    assert [(r["rung"], r["status"]) for r in fault["rungs"]] == [("drain", "done"), ("reset", "failed"), ("reboot", "skipped"),
                                                                  ("cordon", "refused")]
    assert not host.path("/var/lib/hosttune/cordon.json").exists()
    assert down(host) == [False, True] and active(host, "hosttune-engine@1") == "inactive"
    back = runner.invoke(app, ["rollback", "-i", str(one), "--run", fault["rungs"][0]["run"], "--yes"])
    assert back.exit_code == 0, back.output
    assert down(host) == [False, False] and active(host, "hosttune-engine@1") == "active"


def pci_standin(root: Path) -> Path:
    """/sys/bus/pci/devices with three NVIDIA GPUs, one more than the stand-in nvidia-smi shows."""
    for bdf in ("0000:3b:00.0", "0000:86:00.0", "0000:c1:00.0"):
        (root / bdf).mkdir(parents=True)
        (root / bdf / "vendor").write_text("0x10de\n")
        (root / bdf / "class").write_text("0x030200\n")
    return root


def test_a_gpu_missing_from_nvml_reboots_the_host_then_cordons_it(live_fleet, fresh_hosts, tmp_path):
    (host,) = fresh_hosts(["remboot"], binds={"remboot": [Bind(pci_standin(tmp_path / "pci"), "/sys/bus/pci/devices", read_only=True)]})
    base = free_port(2)
    install(host, (base, base + 1))
    healthy(host)
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inv = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host])
    result = remediate(inv, "--reboot", "--max-cordoned-percent", "100")
    assert result.exit_code == 1, result.output
    assert "gpu.count  PCI shows 3 GPU(s), NVML 2: lost 0000:c1:00.0" in result.stdout
    assert "    reboot: done: rebooted and back" in result.stdout and "    cordon: done" in result.stdout
    assert host.machine.num_reboots == 1 and host.path("/var/lib/hosttune/cordon.json").exists()
    assert down(host) == [True, True]


def test_the_circuit_breaker_stops_at_its_percentage_across_four_hosts(fleet):
    hosts, _, four = fleet
    for host in hosts:
        healthy(host, dmesg=XID_79, reset_fails=True)
    result = remediate(four, "--max-cordoned-percent", "50")  # the four climb in parallel, one breaker
    assert result.exit_code == 1, result.output
    cordoned = [h.name for h in hosts if h.path("/var/lib/hosttune/cordon.json").exists()]
    assert len(cordoned) == 2, result.output
    (line,) = [l for l in result.stderr.splitlines() if "circuit breaker open" in l]
    assert "would make 3 of 4 hosts (75%) cordoned within 60 min, over --max-cordoned-percent 50; " \
           "remediation stopped on every host" in line
    assert result.stdout.count("GPU1: stopped") == 2 and result.stdout.count("GPU1: cordoned") == 2
    for host in hosts:
        healthy(host)
