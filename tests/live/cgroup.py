"""One cgroup per test container, so containers never share a cgroup and can be killed whole.

systemd-nspawn --keep-unit runs the container in the cgroup nspawn was started in. Left
in the root cgroup (the case on a host whose PID 1 is not systemd), two containers would
both create `payload/system.slice/ssh.service` in the same place, and stopping sshd in one
would kill the other's. So each container gets `hosttune-live/<run>/<name>` in the
unified hierarchy (and in the v1 `name=systemd` one on hybrid hosts), and nspawn is
moved there before it starts. Killing is then `cgroup.kill`: every process, nothing missed.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TOP = "hosttune-live"


def hierarchies() -> list[Path]:
    """Mount points of the cgroup2 hierarchy and of the v1 name=systemd one, if mounted."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype, options = fields[-3], fields[-1]
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
                found.append(Path(fields[4]))
    return found


class Cgroup:
    """The same relative cgroup path in every hierarchy that matters to systemd."""

    def __init__(self, relative: str):
        self.relative = relative
        self.dirs = [h / relative for h in hierarchies()]

    def create(self) -> None:
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)

    def enter_prefix(self) -> list[str]:
        """argv prefix that moves the process into this cgroup, then execs the rest."""
        moves = "; ".join(f'echo $$ > "{d}/cgroup.procs"' for d in self.dirs)
        return ["/bin/sh", "-c", f'{moves}; exec "$@"', "cgroup-enter"]

    def pids(self) -> set[int]:
        pids: set[int] = set()
        for d in self.dirs:
            for sub in _tree(d):
                pids.update(int(p) for p in _read(sub / "cgroup.procs").split())
        return pids

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL every process in the cgroup tree and wait until they are gone."""
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            self._kill_once()
            time.sleep(0.05)
        if self.pids():
            raise RuntimeError(f"processes survive in cgroup {self.relative}: {sorted(self.pids())}")

    def _kill_once(self) -> None:
        unified = [d for d in self.dirs if (d / "cgroup.kill").exists()]
        if unified:
            (unified[0] / "cgroup.kill").write_text("1")
            return
        for pid in self.pids():
            _signal(pid, signal.SIGKILL)

    def remove(self) -> None:
        """rmdir the tree, deepest first; the processes must already be gone."""
        for d in self.dirs:
            for sub in reversed(_tree(d)):
                _rmdir(sub)
        for h in hierarchies():
            for parent in (h / Path(self.relative).parent, h / TOP):
                _rmdir(parent)  # fails quietly while another container still uses it


def _tree(top: Path) -> list[Path]:
    """top and every cgroup under it, parents first. systemd inside a container removes its
    cgroups while we walk, so a directory that vanishes mid-walk is skipped, never an error."""
    return [Path(root) for root, _, _ in os.walk(top)]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
