"""The health checks against real systemd hosts over SSH: /dev/shm, Xid events from a
kernel-log stand-in, AER counters from a sysfs stand-in, and no GPU anywhere."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .hosts import Bind

pytestmark = pytest.mark.live
runner = CliRunner()
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-health"
GPU_CHECKS = ("gpu.count", "cuda.smoke", "gpu.memory_health", "gpu.nvlink", "gpu.fabric", "pci.p2p",
              "gpu.clocks_power", "gpu.load", "gpu.diag", "gpu.allreduce")


def nic_standin(root: Path) -> Path:
    """/sys/bus/pci/devices with one Mellanox NIC whose AER counters show a fatal completion timeout."""
    dev = root / "0000:5e:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x15b3\n")
    (dev / "class").write_text("0x020000\n")
    for f in (FIXTURES / "aer-sysfs").iterdir():
        shutil.copy(f, dev / f.name)
    return root


def findings(inventory: Path, *extra: str) -> tuple[int, dict[str, dict[str, dict]]]:
    result = runner.invoke(app, ["check", "-i", str(inventory), "--format", "json", *extra])
    doc = json.loads(result.stdout)
    return result.exit_code, {h["host"]: {f["check_id"]: f for f in h["findings"]} for h in doc["hosts"]}


def test_shm_xid_and_aer_on_hosts_without_gpu(live_fleet, fresh_hosts, tmp_path):
    small, faulty = fresh_hosts(["shmsmall", "xidaer"], binds={"xidaer": [Bind(nic_standin(tmp_path / "pci"), "/sys/bus/pci/devices", read_only=True)]})
    small.exec("mount -o remount,size=64M /dev/shm")
    # A kernel-log stand-in: `dmesg` prints recorded Xid lines (the container cannot read the real ring buffer).
    faulty.path("/usr/local/bin/dmesg").write_text(f"#!/bin/sh\ncat <<'LOG'\n{(FIXTURES / 'dmesg-xid.txt').read_text()}LOG\n")
    faulty.exec("chmod +x /usr/local/bin/dmesg")
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [small, faulty])
    inv = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [small, faulty])

    code, by_host = findings(inv)
    assert code & 1
    s, f = by_host["shmsmall"], by_host["xidaer"]
    assert s["sys.shm"]["status"] == "drift" and "64 MiB" in s["sys.shm"]["active"]
    assert f["sys.shm"]["status"] == "ok"
    assert s["gpu.xid"]["status"] == "not-applicable"
    assert f["gpu.xid"]["status"] == "drift" and f["gpu.xid"]["severity"] == "critical"
    assert "PCI 0000:3b:00 Xid 79: GPU has fallen off the bus" in f["gpu.xid"]["detail"]
    assert f["gpu.xid"]["active"] == "6 Xid event(s) since boot (from dmesg)"
    assert f["pci.aer"]["status"] == "drift" and f["pci.aer"]["severity"] == "critical"
    assert "nic 0000:5e:00.0: fatal CmpltTO 1" in f["pci.aer"]["detail"]
    for host in (s, f):
        assert all(host[c]["status"] == "not-applicable" for c in GPU_CHECKS), {c: host[c]["status"] for c in GPU_CHECKS}


def test_active_check_without_gpu_changes_nothing_and_runs_no_load(live_fleet, fresh_hosts, tmp_path):
    (host,) = fresh_hosts(["activenogpu"])
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inv = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host])
    before = host.exec("find /etc /var/lib -newer /etc/hostname -type f | sort").stdout
    _, by_host = findings(inv, "--active")
    f = by_host["activenogpu"]
    assert {f[c]["status"] for c in ("gpu.load", "gpu.diag", "gpu.allreduce", "cuda.smoke")} == {"not-applicable"}
    assert f["gpu.load"]["detail"] == "no NVIDIA GPU on this host"
    assert host.exec("find /etc /var/lib -newer /etc/hostname -type f | sort").stdout == before
