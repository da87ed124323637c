"""Live test hosts: Debian bookworm systemd containers reached over real SSH on loopback.

    image = ensure_image()                      # debootstrap once, cached
    with Fleet(image) as fleet:
        a, b = fleet.boot(["alpha", "beta"])    # booted in parallel, sshd answering
        a.exec("systemctl is-active ssh")       # from the host side, via nsenter
        with a.connect(user="deploy") as ssh:   # real SSH, host key checked
            ...
        fleet.stop(b)                           # b's port now refuses connections

All containers share the host's network namespace; each sshd listens on its own port on
127.0.0.1. Every container's root is an overlay over the cached image (a copy where
overlayfs is unavailable), so booting costs no copy and the image is never written.
"""
from __future__ import annotations

import base64
import dataclasses
import os
import random
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from .cgroup import TOP, Cgroup
from .image import Image, remove_tree, remove_tree_later
from .machine import Bind, BootError, Machine
from .rootfs import ADDRESS, make_root, personalize
from .sshkeys import KeyPair, generate_key, known_hosts_line, ssh_config_block

__all__ = ["Bind", "BootError", "BootTiming", "Fleet", "LiveHost", "sweep_stale_runs"]

WORK_ROOT = Path(os.environ.get("HOSTTUNE_LIVE_WORKDIR", "/var/tmp/hosttune-live"))
BOOT_TIMEOUT_S = float(os.environ.get("HOSTTUNE_BOOT_TIMEOUT", "120"))
PORT_RANGE = (20000, 30000)  # below the kernel's ephemeral range, so outgoing sockets never take them
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")


@dataclass(frozen=True)
class LiveHost:
    name: str          # also the container's hostname
    address: str       # always 127.0.0.1: containers share the host's network
    port: int          # this container's sshd port
    user: str          # "root"; as_user("deploy") gives the sudo-capable non-root login
    key_path: Path     # client private key, authorized for root and deploy
    root: Path         # the container's / as seen from the host (write files here for setup)
    machine: Machine   # the running container: stop/start go through Fleet
    host_key: str      # "ssh-ed25519 AAAA... <name>", this container's sshd host key

    def as_user(self, user: str) -> "LiveHost":
        return dataclasses.replace(self, user=user)

    def path(self, container_path: str) -> Path:
        """The host-side path of a file inside the container."""
        return self.root / container_path.lstrip("/")

    def known_hosts_line(self) -> str:
        return known_hosts_line(self.address, self.port, self.host_key)

    def exec(self, command: str | Sequence[str], *, check: bool = True, input: str | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a command as root inside the container, from the host side (no SSH involved).

        A string runs through /bin/sh -c; a list is argv. Output is captured as text.
        """
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        exec_cgroup = Cgroup(f"{self.machine.cgroup.relative}/exec")
        exec_cgroup.create()  # so whatever the command leaves running dies with the container
        proc = subprocess.run(exec_cgroup.enter_prefix() + self.machine.nsenter_argv() + argv,
                              input=input, capture_output=True, text=True, timeout=timeout)
        proc.args = argv
        if check and proc.returncode != 0:
            raise AssertionError(
                f"[{self.name}] {argv!r} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def connect(self, user: str | None = None, timeout: float = 10.0):
        """A connected paramiko SSHClient; the host key is checked, unknown keys rejected."""
        import paramiko  # only live tests that SSH need it

        keytype, blob = self.host_key.split()[:2]
        client = paramiko.SSHClient()
        client.get_host_keys().add(f"[{self.address}]:{self.port}", keytype,
                                   paramiko.PKey.from_type_string(keytype, base64.b64decode(blob)))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(self.address, self.port, username=user or self.user,
                       key_filename=str(self.key_path), look_for_keys=False, allow_agent=False,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
        return client


@dataclass(frozen=True)
class BootTiming:
    root_mode: str  # "overlay" or "copy"
    root_s: float   # making the container's writable root
    boot_s: float | None  # nspawn start to sshd banner; None until it has booted


class Fleet:
    """Owns a set of containers for one test run; close() kills them all, always."""

    def __init__(self, image: Image, work_root: Path = WORK_ROOT):
        self.image = image
        self.run_id = f"{os.getpid()}-{int(time.time())}"
        self.workdir = work_root / self.run_id
        self.workdir.mkdir(parents=True)
        (self.workdir / "owner.pid").write_text(f"{os.getpid()}\n")
        self.client_key: KeyPair = generate_key(self.workdir / "client_ed25519", "hosttune-tests")
        self.hosts: dict[str, LiveHost] = {}
        self.timings: dict[str, BootTiming] = {}
        self._ports: set[int] = set()
        self._removals: list[subprocess.Popen] = []  # removed hosts' files, deleted in the background

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- boot --------------------------------------------------------------------------

    def boot(self, names: Sequence[str], binds: Mapping[str, Sequence[Bind]] | None = None,
             nspawn_args: Sequence[str] = (), timeout: float = BOOT_TIMEOUT_S) -> list[LiveHost]:
        """Boot one container per name, in parallel; return when every sshd answers."""
        binds = binds or {}
        hosts = [self._prepare(n, tuple(binds.get(n, ())), tuple(nspawn_args)) for n in names]
        started = time.monotonic()
        for host in hosts:
            host.machine.spawn()
        deadline = started + timeout
        with ThreadPoolExecutor(len(hosts)) as pool:
            boot_s = list(pool.map(lambda h: self._wait(h, deadline, started), hosts))
        for host, seconds in zip(hosts, boot_s):
            self.timings[host.name] = dataclasses.replace(self.timings[host.name], boot_s=seconds)
        return hosts

    def _wait(self, host: LiveHost, deadline: float, started: float) -> float:
        host.machine.wait_ready(host.port, deadline)
        return time.monotonic() - started

    def _prepare(self, name: str, binds: tuple[Bind, ...], nspawn_args: tuple[str, ...]) -> LiveHost:
        if name in self.hosts or not name.replace("-", "").isalnum() or name != name.lower():
            raise ValueError(f"host name {name!r} is taken or not a lowercase hostname")
        hostdir = self.workdir / name
        hostdir.mkdir()
        started = time.monotonic()
        root, mode = make_root(self.image.root, hostdir)
        root_s = time.monotonic() - started
        port = self._free_port()
        host_key = generate_key(hostdir / "ssh_host_ed25519_key", name)
        personalize(root, name, port, host_key, self.client_key.public)
        machine = Machine(
            machine_name=f"ht{os.getpid()}-{name}", hostname=name, root=root,
            console_log=hostdir / "console.log",
            cgroup=Cgroup(f"{TOP}/{self.run_id}/{name}"), binds=binds + cpuidle_standin(hostdir),
            extra_args=nspawn_args,
        )
        host = LiveHost(name, ADDRESS, port, "root", self.client_key.private_path, root,
                        machine, host_key.public)
        self.hosts[name] = host
        self.timings[name] = BootTiming(mode, root_s, None)
        return host

    def _free_port(self) -> int:
        for _ in range(1000):
            port = random.randrange(*PORT_RANGE)
            if port not in self._ports and _port_is_free(port):
                self._ports.add(port)
                return port
        raise RuntimeError("no free loopback port found")

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self, host: LiveHost) -> None:
        """Power the container off; its port refuses connections afterwards."""
        host.machine.stop()

    def start(self, host: LiveHost, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Boot a stopped container again (same root, same port, same keys)."""
        host.machine.spawn()
        self.wait_ready(host, timeout)

    def wait_ready(self, host: LiveHost, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Wait until the host's sshd answers, e.g. after a `reboot` inside it."""
        host.machine.wait_ready(host.port, time.monotonic() + timeout)

    @contextmanager
    def stopped(self, host: LiveHost) -> Iterator[LiveHost]:
        """Stop a host for the body of a with-block, then boot it again."""
        self.stop(host)
        try:
            yield host
        finally:
            self.start(host)

    def remove(self, host: LiveHost) -> None:
        """Kill one container and delete its root and files (in the background: close() waits for it)."""
        host.machine.stop(timeout=5)
        trash = self.workdir / f".removed-{host.name}-{len(self._removals)}"
        removal = remove_tree_later(self.workdir / host.name, trash)
        if removal is not None:
            self._removals.append(removal)
        self.hosts.pop(host.name, None)
        self._ports.discard(host.port)

    def close(self) -> None:
        """Kill every container, unmount every root, remove the run's files."""
        errors = []
        for host in self.hosts.values():
            try:
                host.machine.stop(timeout=5)
            except Exception as e:  # keep cleaning the others
                errors.append(f"{host.name}: {e}")
        Cgroup(f"{TOP}/{self.run_id}").kill()
        Cgroup(f"{TOP}/{self.run_id}").remove()
        for removal in self._removals:
            removal.wait()
        remove_tree(self.workdir)
        self.hosts.clear()
        if errors:
            raise RuntimeError("cleanup of live hosts: " + "; ".join(errors))

    # -- files for clients -------------------------------------------------------------

    def write_known_hosts(self, path: Path, hosts: Sequence[LiveHost] | None = None) -> Path:
        lines = [h.known_hosts_line() for h in (hosts if hosts is not None else self.hosts.values())]
        path.write_text("".join(f"{line}\n" for line in lines))
        return path

    def write_inventory(self, path: Path, known_hosts: Path, hosts: Sequence[LiveHost] | None = None,
                        user: str = "root", become: bool = False, group: str = "live",
                        host_vars: Mapping[str, Mapping] | None = None) -> Path:
        """A hosttune inventory (inventories/example.yaml's layout) naming these hosts."""
        import yaml

        hosts = list(hosts if hosts is not None else self.hosts.values())
        host_vars = host_vars or {}
        inventory = {
            "defaults": {"ssh": {"user": user, "key": str(self.client_key.private_path),
                                 "known_hosts": str(known_hosts), "become": become}},
            "groups": {group: {"hosts": {
                h.name: _host_entry(h, host_vars.get(h.name, {})) for h in hosts
            }}},
        }
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        return path

    def write_ssh_config(self, path: Path, known_hosts: Path,
                         hosts: Sequence[LiveHost] | None = None) -> Path:
        blocks = [ssh_config_block(h.name, h.address, h.port, h.user, h.key_path, known_hosts)
                  for h in (hosts if hosts is not None else self.hosts.values())]
        path.write_text("\n".join(blocks))
        return path


def _host_entry(host: LiveHost, extra: Mapping) -> dict:
    ssh = {"port": host.port, **extra.get("ssh", {})}
    return {"address": host.address, **{k: v for k, v in extra.items() if k != "ssh"}, "ssh": ssh}


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((ADDRESS, port))
            return True
        except OSError:
            return False


def sweep_stale_runs(work_root: Path = WORK_ROOT) -> list[str]:
    """Kill and remove what earlier runs left behind when they died without cleaning up."""
    swept = []
    for rundir in sorted(work_root.glob("*-*")) if work_root.exists() else ():
        if _owner_alive(rundir):
            continue
        Cgroup(f"{TOP}/{rundir.name}").kill()
        Cgroup(f"{TOP}/{rundir.name}").remove()
        remove_tree(rundir)
        owner_pid = rundir.name.split("-")[0]
        for leftover in Path("/run/systemd/nspawn/propagate").glob(f"ht{owner_pid}-*"):
            leftover.rmdir()  # nspawn's per-machine directory; empty once the machine is gone
        swept.append(rundir.name)
    return swept


NEW_RUN_S = 300  # a run directory without its owner.pid yet is being made (Fleet writes it next), not stale


def _owner_alive(rundir: Path) -> bool:
    """Whether the process that made this run directory still runs. Another xdist worker may have just made it:
    one without owner.pid counts as alive for NEW_RUN_S."""
    try:
        pid = int((rundir / "owner.pid").read_text())
    except FileNotFoundError:
        try:
            return time.time() - rundir.stat().st_mtime < NEW_RUN_S
        except FileNotFoundError:
            return True  # gone already: nothing to sweep
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def cpuidle_standin(hostdir: Path, real: Path = CPUIDLE) -> tuple[Bind, ...]:
    """Where the VM running the tests has no cpuidle driver (current_driver "none"; a container sees the VM's
    kernel), a read-only stand-in naming one, so every container judges C-states as a bare-metal host with
    idle states does; where the VM has a driver, nothing (its own is seen)."""
    driver = real / "current_driver"
    if not driver.is_file() or driver.read_text().strip() != "none":
        return ()
    standin = hostdir / "cpuidle"
    standin.mkdir()
    for f in real.iterdir():
        if f.is_file():
            (standin / f.name).write_text(f.read_text())
    (standin / "current_driver").write_text("acpi_idle\n")
    return (Bind(standin, str(real), read_only=True),)
