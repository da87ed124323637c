"""The live-host harness itself: containers boot, answer real SSH, and clean up after."""
from __future__ import annotations

import os
import socket
import subprocess
import time

import paramiko
import pytest

from .cgroup import TOP, Cgroup
from .hosts import NEW_RUN_S, Bind, BootError, Fleet, cpuidle_standin, sweep_stale_runs
from .image import mounts_under
from .sshkeys import known_hosts_line

pytestmark = pytest.mark.live

# A small real package at a version bookworm has carried since its release.
PINNED_PACKAGE, PINNED_VERSION = "hello", "2.10-3"


def ssh_run(host, command: str, user: str | None = None) -> tuple[int, str, str]:
    with host.connect(user=user) as client:
        _, stdout, stderr = client.exec_command(command, timeout=120)
        rc = stdout.channel.recv_exit_status()
        return rc, stdout.read().decode(), stderr.read().decode()


def port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


def test_two_hosts_boot_with_systemd_as_pid1_and_answer_ssh_as_root(live_hosts):
    assert len({h.port for h in live_hosts}) == 2
    for host in live_hosts:
        rc, out, err = ssh_run(host, "id -u; hostname; cat /proc/1/comm; systemctl is-system-running --wait")
        assert rc == 0, err
        assert out.split() == ["0", host.name, "systemd", "running"]


def test_deploy_user_logs_in_and_has_passwordless_sudo(live_hosts):
    host = live_hosts[0].as_user("deploy")
    rc, out, err = ssh_run(host, "id -un; sudo -n id -u")
    assert (rc, out.split()) == (0, ["deploy", "0"]), err


def test_each_host_has_its_own_host_key_and_unknown_keys_are_refused(live_hosts, tmp_path):
    assert live_hosts[0].host_key.split()[1] != live_hosts[1].host_key.split()[1]
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        client.connect("127.0.0.1", live_hosts[0].port, username="root",
                       key_filename=str(live_hosts[0].key_path), look_for_keys=False, allow_agent=False)


def test_openssh_client_uses_written_known_hosts_and_rejects_a_wrong_key(live_fleet, live_hosts, tmp_path):
    good = live_fleet.write_known_hosts(tmp_path / "known_hosts", live_hosts)
    config = live_fleet.write_ssh_config(tmp_path / "ssh_config", good, live_hosts)
    ok = subprocess.run(["ssh", "-F", str(config), "alpha", "hostname"], capture_output=True, text=True)
    assert (ok.returncode, ok.stdout.strip()) == (0, "alpha"), ok.stderr
    # beta's key recorded for alpha's address: a changed host key, which ssh must refuse.
    alpha, beta = live_hosts
    (tmp_path / "known_hosts").write_text(known_hosts_line(alpha.address, alpha.port, beta.host_key) + "\n")
    bad = subprocess.run(["ssh", "-F", str(config), "alpha", "true"], capture_output=True, text=True)
    assert bad.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in bad.stderr


def test_exec_and_host_side_root_see_the_same_files(live_hosts):
    host = live_hosts[0]
    host.path("/var/lib/harness-marker").write_text("from the host side\n")
    try:
        assert host.exec("cat /var/lib/harness-marker").stdout == "from the host side\n"
        rc, out, _ = ssh_run(host, "cat /var/lib/harness-marker")
        assert out == "from the host side\n"
        assert host.exec("exit 3", check=False).returncode == 3
    finally:
        host.path("/var/lib/harness-marker").unlink()


def test_apt_reaches_the_mirror_and_installs_a_pinned_package(fresh_hosts):
    (host,) = fresh_hosts(["apt"])
    update = host.exec("apt-get update -q", check=False)
    assert update.returncode == 0, f"apt-get update cannot reach Debian's mirror:\n{update.stderr}"
    host.exec(f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q {PINNED_PACKAGE}={PINNED_VERSION}")
    rc, out, err = ssh_run(host, f"dpkg-query -W -f '${{Version}}' {PINNED_PACKAGE}; hello")
    assert (rc, out.splitlines()) == (0, [f"{PINNED_VERSION}Hello, world!"]), err


def test_stopping_a_host_makes_its_port_refuse_and_start_brings_it_back(live_fleet, fresh_hosts):
    up, down = fresh_hosts(["up", "down"])
    live_fleet.stop(down)
    assert port_refuses(down.port)
    assert ssh_run(up, "true")[0] == 0
    live_fleet.start(down)
    assert ssh_run(down, "hostname")[1].strip() == "down"


def test_reboot_inside_a_host_brings_it_back_like_a_real_host(live_fleet, fresh_hosts):
    (host,) = fresh_hosts(["reboots"])
    host.exec("touch /run/before-reboot")  # /run is a fresh tmpfs on every boot
    rc, _, err = ssh_run(host, "systemctl reboot")
    assert rc == 0, err
    deadline = time.monotonic() + 30
    while host.machine.num_reboots == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    live_fleet.wait_ready(host)
    assert host.machine.num_reboots == 1
    assert ssh_run(host, "test -e /run/before-reboot")[0] == 1


def test_bound_standins_make_read_only_kernel_paths_writable(fresh_hosts, tmp_path):
    thp, irq, cmdline = tmp_path / "thp", tmp_path / "irq", tmp_path / "cmdline"
    thp.mkdir()
    (thp / "enabled").write_text("always [madvise] never\n")
    (irq / "42").mkdir(parents=True)
    (irq / "42/smp_affinity_list").write_text("0-15\n")
    cmdline.write_text("BOOT_IMAGE=/vmlinuz intel_idle.max_cstate=1\n")
    binds = [Bind(thp, "/sys/kernel/mm/transparent_hugepage"), Bind(irq, "/proc/irq"),
             Bind(cmdline, "/proc/cmdline", read_only=True)]
    (host,) = fresh_hosts(["standin"], binds={"standin": binds})
    rc, out, err = ssh_run(host, "echo never > /sys/kernel/mm/transparent_hugepage/enabled && "
                                 "echo 0-3 > /proc/irq/42/smp_affinity_list && cat /proc/cmdline")
    assert (rc, out) == (0, "BOOT_IMAGE=/vmlinuz intel_idle.max_cstate=1\n"), err
    assert (thp / "enabled").read_text() == "never\n"
    assert (irq / "42/smp_affinity_list").read_text() == "0-3\n"
    # Without a stand-in, kernel paths stay read-only inside a container.
    rc, _, err = ssh_run(host, "echo 10 > /proc/sys/vm/swappiness")
    assert rc != 0 and "Read-only file system" in err


def test_a_container_that_cannot_boot_fails_with_its_console(fresh_hosts, tmp_path):
    with pytest.raises(BootError, match="(?s)exited with 1.*Failed to stat .*/missing"):
        fresh_hosts(["nostart"], nspawn_args=[f"--bind={tmp_path}/missing:/mnt"])


def test_a_host_whose_sshd_never_answers_times_out_with_its_console(live_fleet, fresh_hosts):
    (host,) = fresh_hosts(["nossh"])
    host.exec("systemctl disable ssh.service")
    live_fleet.stop(host)
    with pytest.raises(BootError, match="(?s)did not answer in time.*Console"):
        live_fleet.start(host, timeout=3)


def test_close_leaves_no_process_mount_or_file(live_image, tmp_path):
    fleet = Fleet(live_image, work_root=tmp_path)
    host, removed = fleet.boot(["gone", "removed"])
    cgroup = Cgroup(f"{TOP}/{fleet.run_id}")
    assert cgroup.pids() and mounts_under(fleet.workdir)
    fleet.remove(removed)  # its files deleted in the background, its name free again at once
    assert not (fleet.workdir / "removed").exists() and not mounts_under(fleet.workdir / "removed")
    assert port_refuses(removed.port)
    fleet.close()
    assert not cgroup.pids()
    assert not any(d.exists() for d in cgroup.dirs)
    assert not mounts_under(tmp_path)
    assert not fleet.workdir.exists()
    assert port_refuses(host.port)


def test_a_cpuidle_stand_in_names_a_driver_only_where_the_vm_running_the_tests_has_none(tmp_path):
    real = tmp_path / "cpuidle"
    real.mkdir()
    (real / "current_driver").write_text("none\n")
    (real / "current_governor").write_text("menu\n")
    (tmp_path / "a").mkdir()
    (bind,) = cpuidle_standin(tmp_path / "a", real)
    assert (bind.path, bind.read_only) == (str(real), True)
    assert (bind.host_path / "current_driver").read_text() == "acpi_idle\n"
    assert (bind.host_path / "current_governor").read_text() == "menu\n"
    (real / "current_driver").write_text("intel_idle\n")
    (tmp_path / "b").mkdir()
    assert cpuidle_standin(tmp_path / "b", real) == ()


def test_the_sweep_removes_dead_runs_and_leaves_ones_being_made(tmp_path):
    """Each xdist worker sweeps at its start: a run another worker has just made (no owner.pid yet) is left alone,
    as is one whose owner runs; one whose owner is gone, or made long ago and never finished, is removed."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    runs = {name: tmp_path / name for name in ("1-new", "2-alive", "3-dead", "4-abandoned")}
    for rundir in runs.values():
        rundir.mkdir()
    (runs["2-alive"] / "owner.pid").write_text(f"{os.getpid()}\n")
    (runs["3-dead"] / "owner.pid").write_text(f"{dead.pid}\n")
    long_ago = time.time() - NEW_RUN_S - 60
    os.utime(runs["4-abandoned"], (long_ago, long_ago))
    assert sorted(sweep_stale_runs(tmp_path)) == ["3-dead", "4-abandoned"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1-new", "2-alive"]
