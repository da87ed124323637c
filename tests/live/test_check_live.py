"""`hosttune check` against real systemd hosts over real SSH, through an inventory."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.checks import CATALOGUE
from hosttune.cli import app
from hosttune.fleet_runner import EXIT_UNREACHABLE

from .apply_setup import HALTPOLL
from .sshkeys import known_hosts_line

pytestmark = pytest.mark.live
runner = CliRunner()

# The image has Debian's irqbalance, enabled, but its unit refuses to start in a container
# (ConditionVirtualization). To have one *running*, a stand-in unit of the same name runs a
# process named irqbalance (the real daemon would write the container's read-only /proc/irq).
IRQBALANCE_UNIT = """\
[Unit]
Description=irqbalance stand-in for hosttune's live tests
[Service]
ExecStart=/usr/local/sbin/irqbalance infinity
[Install]
WantedBy=multi-user.target
"""
FAKE_DRIVER_PKG = "nvidia-kernel-common-535"


def build_fake_driver_package(host) -> None:
    """An empty but real .deb named like the NVIDIA driver's, installed with dpkg."""
    host.exec(textwrap.dedent(f"""\
        set -e
        d=$(mktemp -d); mkdir -p $d/DEBIAN
        printf 'Package: {FAKE_DRIVER_PKG}\\nVersion: 535.129.03-1\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: test\\n' > $d/DEBIAN/control
        dpkg-deb --build $d /tmp/pkg.deb >/dev/null && dpkg -i /tmp/pkg.deb >/dev/null
    """))


def set_up_tuned_looking(host) -> None:
    """irqbalance running and enabled, driver package held, numa_balancing=0 persisted, C-states in grub."""
    host.exec("cp /bin/sleep /usr/local/sbin/irqbalance")
    host.path("/etc/systemd/system/irqbalance.service").write_text(IRQBALANCE_UNIT)
    host.exec("systemctl daemon-reload && systemctl enable --now irqbalance.service")
    build_fake_driver_package(host)
    host.exec(f"apt-mark hold {FAKE_DRIVER_PKG}")
    host.path("/etc/sysctl.d/90-hosttune-test.conf").write_text("kernel.numa_balancing = 0\n")
    host.path("/etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_idle.max_cstate=1 processor.max_cstate=1"\n')


def set_up_untuned(host) -> None:
    """irqbalance disabled and stopped, driver package not held, numa_balancing=1 persisted."""
    host.exec("systemctl disable irqbalance.service")
    build_fake_driver_package(host)
    host.path("/etc/sysctl.d/90-hosttune-test.conf").write_text("kernel.numa_balancing = 1\n")


def write_inventory(path: Path, hosts, known_hosts: Path, *, deploy_with_become: bool = False) -> Path:
    lines = ["groups:", "  live:", "    hosts:"]
    for h in hosts:
        user, become = ("deploy", "true") if deploy_with_become and h is hosts[-1] else ("root", "false")
        lines += [
            f"      {h.name}:",
            f"        address: {h.address}",
            f"        ssh: {{port: {h.port}, user: {user}, key: {h.key_path}, known_hosts: {known_hosts}, timeout: 5, become: {become}}}",
            '        pins: {python: "3.11"}',
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def check_json(inventory: Path, *extra: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["check", "-i", str(inventory), "--format", "json", *extra])
    return result.exit_code, json.loads(result.stdout)


def findings(doc: dict, host: str) -> dict[str, dict]:
    entry = next(h for h in doc["hosts"] if h["host"] == host)
    assert entry["reachable"], entry["error"]
    return {f["check_id"]: f for f in entry["findings"]}


@pytest.fixture
def two_hosts(fresh_hosts):
    tuned, untuned = fresh_hosts(["tuned", "untuned"])
    set_up_tuned_looking(tuned)
    set_up_untuned(untuned)
    return tuned, untuned


def test_findings_reflect_each_host(two_hosts, live_fleet, tmp_path):
    tuned, untuned = two_hosts
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [tuned, untuned])
    inv = write_inventory(tmp_path / "inv.yaml", [tuned, untuned], known, deploy_with_become=True)
    code, doc = check_json(inv)
    a, b = findings(doc, "tuned"), findings(doc, "untuned")

    assert a["irq.irqbalance"]["status"] == "drift"
    assert (a["irq.irqbalance"]["configured"], a["irq.irqbalance"]["active"]) == ("enabled", "running")
    assert b["irq.irqbalance"]["status"] == "ok"
    assert (b["irq.irqbalance"]["configured"], b["irq.irqbalance"]["active"]) == ("disabled", "stopped")

    assert a["driver.held"]["status"] == "ok"
    assert b["driver.held"]["status"] == "drift" and FAKE_DRIVER_PKG in b["driver.held"]["detail"]

    assert a["numa.topology"]["configured"] == "0"
    assert b["numa.topology"]["configured"] == "1" and b["numa.topology"]["status"] == "drift"
    assert "/etc/sysctl.d/90-hosttune-test.conf" in b["numa.topology"]["detail"]

    if HALTPOLL:  # the containers' kernel is a haltpoll guest's: no deep state to cap, whatever grub says
        assert {h["cpu.cstates"]["status"] for h in (a, b)} == {"not-applicable"}
        assert all(h["cpu.cstates"]["detail"].startswith("cpuidle driver haltpoll: a paravirtual guest") for h in (a, b))
    else:
        assert a["cpu.cstates"]["status"] == "pending-reboot"  # in grub, not in /proc/cmdline
        assert b["cpu.cstates"]["status"] == "drift" and "no bootloader configuration" in b["cpu.cstates"]["detail"]
    assert b["kernel.rcu_nocbs"]["status"] == "drift" and "no bootloader configuration" in b["kernel.rcu_nocbs"]["detail"]

    assert a["python.version"]["status"] == "ok"  # bookworm's python3.11
    assert a["driver.version"]["status"] == "not-applicable"  # no NVIDIA GPU in a container
    assert code & 1 and not code & EXIT_UNREACHABLE

    # the text report says so in one line naming the checks it leaves out, not one line a check
    text = runner.invoke(app, ["check", "-i", str(inv), "--limit", "tuned"]).stdout
    (no_gpu,) = [line for line in text.splitlines() if "no NVIDIA GPU on this host:" in line]
    named = set(no_gpu.split(": ", 1)[1].split(", "))
    assert no_gpu.startswith("  n/a     ") and {"driver.version", "gpu.count", "gpu.ecc"} <= named
    assert not any(line.split()[:2] == ["n/a", "gpu.count"] for line in text.splitlines())


def test_become_runs_the_probe_as_root(two_hosts, live_fleet, tmp_path):
    tuned, untuned = two_hosts
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [untuned])
    inv = write_inventory(tmp_path / "inv.yaml", [untuned], known, deploy_with_become=True)
    result = runner.invoke(app, ["facts", "-i", str(inv)])
    facts = json.loads(result.stdout)["untuned"]
    assert facts["is_root"] is True and facts["hostname"] == "untuned"


def test_unknown_host_key_is_refused_unless_accepted(live_hosts, tmp_path):
    alpha = live_hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = write_inventory(tmp_path / "inv.yaml", [alpha], known)
    code, doc = check_json(inv)
    (entry,) = doc["hosts"]
    assert entry["reachable"] is False and "unknown SSH host key" in entry["error"]
    assert code & EXIT_UNREACHABLE
    code, doc = check_json(inv, "--accept-new-host-keys")
    assert doc["hosts"][0]["reachable"] is True
    assert alpha.host_key.split()[1] in known.read_text()


def test_changed_host_key_is_a_hard_failure_naming_the_host(live_hosts, tmp_path):
    alpha, beta = live_hosts
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_line(alpha.address, alpha.port, beta.host_key) + "\n")
    inv = write_inventory(tmp_path / "inv.yaml", [alpha], known)
    code, doc = check_json(inv, "--accept-new-host-keys")
    (entry,) = doc["hosts"]
    assert entry["reachable"] is False
    assert "alpha: SSH HOST KEY CHANGED" in entry["error"]


def test_stopped_host_is_unreachable_and_the_other_still_checked(fresh_hosts, live_fleet, tmp_path):
    up, down = fresh_hosts(["up2", "down2"])
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [up, down])
    inv = write_inventory(tmp_path / "inv.yaml", [up, down], known)
    live_fleet.stop(down)
    code, doc = check_json(inv)
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["down2"]["reachable"] is False and "connection refused" in by["down2"]["error"]
    assert by["up2"]["reachable"] is True and len(by["up2"]["findings"]) == len(CATALOGUE)
    assert code & EXIT_UNREACHABLE


def test_hostile_ssh_user_executes_nothing(live_hosts, tmp_path):
    alpha = live_hosts[0]
    marker = f"/tmp/pwned-{tmp_path.name}"
    known = tmp_path / "known_hosts"
    known.write_text(alpha.known_hosts_line() + "\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  alpha:\n    address: {alpha.address}\n"
        f"    ssh: {{port: {alpha.port}, user: '$(touch {marker}); root', key: {alpha.key_path}, known_hosts: {known}, timeout: 5}}\n"
    )
    code, doc = check_json(inv)
    assert doc["hosts"][0]["reachable"] is False and "authentication failed" in doc["hosts"][0]["error"]
    assert not Path(marker).exists()
    assert alpha.exec(f"test -e {marker}", check=False).returncode == 1
