"""One systemd-nspawn container: spawn it, find its PID 1, wait for sshd, stop it, kill it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .cgroup import Cgroup

CONSOLE_TAIL_LINES = 60
STANDIN_STAGING = "/.hosttune-standins"
REBOOT_EXIT = 133  # nspawn's exit status when the container rebooted (systemd-nspawn@.service restarts on it)


class BootError(RuntimeError):
    """A container did not boot, or its sshd did not answer before the deadline."""


@dataclass(frozen=True)
class Bind:
    """A host directory or file bound over a container path.

    The way to make a writable stand-in for a read-only kernel path: inside a container
    /proc/sys and /sys are read-only, so Bind(tmp_dir, "/sys/kernel/mm/transparent_hugepage")
    lets a test watch what would have been written there. Targets under /proc must already
    exist there (procfs has no room for new mount points): /proc/cmdline, /proc/irq, ...
    """

    host_path: Path
    path: str
    read_only: bool = False

    def nspawn_arg(self) -> str:
        flag = "--bind-ro" if self.read_only else "--bind"
        return f"{flag}={self.host_path}:{self.path}"


class Machine:
    """The running container behind a LiveHost; mutable because it can be stopped and started."""

    def __init__(self, machine_name: str, hostname: str, root: Path, console_log: Path,
                 cgroup: Cgroup, binds: tuple[Bind, ...] = (), extra_args: tuple[str, ...] = ()):
        self.machine_name = machine_name
        self.hostname = hostname
        self.root = root
        self.console_log = console_log
        self.cgroup = cgroup
        self.binds = binds
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None
        self.leader: int | None = None  # host PID of the container's PID 1 (systemd)
        self.num_reboots = 0
        self._is_stopping = False
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def argv(self) -> list[str]:
        return [
            "systemd-nspawn", "--register=no", "--keep-unit", "--boot",
            f"--machine={self.machine_name}", f"--hostname={self.hostname}",
            f"--directory={self.root}", "--console=read-only", "--link-journal=no",
            "--resolv-conf=copy-host",
            *self._bind_args(), *self.extra_args,
        ]

    def _bind_args(self) -> list[str]:
        args = []
        for i, bind in enumerate(self.binds):
            if bind.path.startswith("/proc/"):
                # nspawn mounts binds into /proc only after entering the container's root,
                # where host paths no longer resolve: bind the host path to a staging point
                # in the root first, then the staging point over the /proc path.
                stage = f"{STANDIN_STAGING}/{i}"
                args.append(Bind(bind.host_path, stage, bind.read_only).nspawn_arg())
                args.append(Bind(Path(stage), bind.path, bind.read_only).nspawn_arg())
            else:
                args.append(bind.nspawn_arg())
        return args

    def _make_staging_points(self) -> None:
        for i, bind in enumerate(self.binds):
            if bind.path.startswith("/proc/"):
                point = self.root / STANDIN_STAGING.lstrip("/") / str(i)
                point.parent.mkdir(exist_ok=True)
                if bind.host_path.is_dir():
                    point.mkdir(exist_ok=True)
                else:
                    point.touch()

    @property
    def is_running(self) -> bool:
        """True while the container runs, and while it reboots (nspawn is then started again)."""
        if self.process is None:
            return False
        rc = self.process.poll()
        return rc is None or (rc == REBOOT_EXIT and not self._is_stopping)

    def spawn(self) -> None:
        assert not self.is_running, f"{self.machine_name} is already running"
        self._is_stopping = False
        self.cgroup.create()
        self._make_staging_points()
        self._start_process()
        self._watcher = threading.Thread(target=self._restart_on_reboot, daemon=True)
        self._watcher.start()

    def _start_process(self) -> None:
        with open(self.console_log, "ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(self.argv())}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.cgroup.enter_prefix() + self.argv(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C in the terminal reaches pytest, not the containers
            )
        self.leader = None

    def _restart_on_reboot(self) -> None:
        # A `reboot` inside the container ends nspawn with 133; boot it again, as a real
        # host would come back, so reboot-and-wait-for-SSH code can be tested.
        while True:
            rc = self.process.wait()
            with self._lock:
                if rc != REBOOT_EXIT or self._is_stopping:
                    return
                self.num_reboots += 1
                self._start_process()

    def wait_ready(self, port: int, deadline: float) -> None:
        """Block until sshd on 127.0.0.1:port sends its banner and PID 1 is known."""
        while time.monotonic() < deadline:
            if not self.is_running:
                raise BootError(self._failure(f"systemd-nspawn exited with {self.process.returncode}"))
            if self.find_leader() is not None and ssh_banner(port):
                return
            time.sleep(0.1)
        raise BootError(self._failure(f"sshd on 127.0.0.1:{port} did not answer in time"))

    def find_leader(self) -> int | None:
        """The host PID of the container's PID 1 (a child of nspawn; new after a reboot)."""
        self.leader = self._child_init()
        return self.leader

    def _child_init(self) -> int | None:
        pid = self.process.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # nspawn gone, or going while read
            return None
        for child in map(int, children):
            if _ns_pid(child) == 1:
                return child
        return None

    def _failure(self, what: str) -> str:
        lines = self.console_log.read_text(errors="replace").splitlines()[-CONSOLE_TAIL_LINES:]
        return f"container {self.machine_name}: {what}. Console ({self.console_log}):\n" + "\n".join(lines)

    def stop(self, timeout: float = 20.0) -> None:
        """Power the container off (nspawn turns SIGTERM into a clean shutdown), else kill it."""
        with self._lock:
            self._is_stopping = True
        if self.is_running:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """Kill every process of the container (cgroup.kill), and remove its cgroups."""
        with self._lock:
            self._is_stopping = True
        self.cgroup.kill()
        if self.process is not None:
            self.process.wait(10)
        if self._watcher is not None:
            self._watcher.join(10)
        self.leader = None
        self.cgroup.remove()
        _rmdir(Path("/run/systemd/nspawn/propagate") / self.machine_name)

    def nsenter_argv(self) -> list[str]:
        """argv prefix that runs a command inside the container's namespaces and root."""
        leader = self.find_leader() if self.process is not None else None
        if leader is None:
            raise RuntimeError(f"container {self.machine_name} is not running")
        return [
            "nsenter", f"--target={leader}", "--mount", "--uts", "--ipc", "--pid",
            "--root", "--wd", "--", "/usr/bin/env", "-i",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME=/root", "LANG=C.UTF-8", "TERM=dumb",
        ]


def ssh_banner(port: int, address: str = "127.0.0.1") -> bool:
    """True if something on address:port speaks SSH (sends an 'SSH-' banner)."""
    try:
        with socket.create_connection((address, port), timeout=1.0) as sock:
            sock.settimeout(2.0)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _ns_pid(pid: int) -> int | None:
    """The PID of `pid` in its innermost PID namespace (1 for a container's init)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return int(ids[-1]) if len(ids) > 1 else None
    except (FileNotFoundError, ProcessLookupError):  # exited before, or while, its status was read
        pass
    return None


def _rmdir(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
