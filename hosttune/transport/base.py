"""What every transport offers: read from or change its host with an argument vector (and optional stdin)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Sequence

from hosttune.errors import ProbeError, ReadOnlyError

SCRIPT_TIMEOUT_S = 120.0

SUDO = ("sudo", "-n", "--")


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command on one host."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


class Transport:
    """A connection to one host; commands are argument vectors, never shell strings.

    Two verbs, so code says what it does to the host: `read` runs a command that changes
    nothing (probes, state scripts, health gates, logs) and `change` one that may change the
    host, which only `hosttune.execute` calls. A transport opened read-only (check, plan,
    verify) refuses `change`. Backends implement `_command`; use a transport as a context
    manager, so it is closed on every path.
    """

    host_name: str
    read_only: bool = False

    def _command(self, argv: Sequence[str], stdin: bytes | None, timeout: float | None) -> CommandResult:
        raise NotImplementedError

    def read(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        return self._command(argv, stdin, timeout)

    def read_script(self, script: str, *args: str, what: str, timeout: float = SCRIPT_TIMEOUT_S) -> str:
        """A shell script that changes nothing, its values as arguments: its output, or ProbeError saying `what` failed."""
        result = self.read(["sh", "-c", script, "hosttune", *args], timeout=timeout)
        if not result.ok:
            raise ProbeError(f"{self.host_name}: {what} failed ({result.rc}): {result.stderr.strip()[-400:]}")
        return result.stdout

    def change(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        if self.read_only:
            raise ReadOnlyError(f"{self.host_name}: this connection is read-only; {argv[0]!r} would change the host")
        return self._command(argv, stdin, timeout)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@lru_cache(maxsize=None)
def bundled_script(package: str, name: str) -> str:
    """A script shipped inside hosttune, sent to hosts as it is (never templated)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def image_script(package: str, name: str) -> str:
    """A bundled script with `in_root` in front: it resolves paths of an image (--root) inside the image."""
    return bundled_script("hosttune.transport", "in_root.sh") + "\n" + bundled_script(package, name)


def with_become(argv: Sequence[str], become: bool) -> tuple[str, ...]:
    """Prefix argv with non-interactive sudo when the host asks for privilege escalation."""
    return (*SUDO, *argv) if become else tuple(argv)


@dataclass(frozen=True)
class ConnectionSpec:
    """How to reach one host: built from the inventory, consumed by the transport registry."""

    host_name: str
    transport: str = "local"  # "local" | "ssh"
    address: str = "localhost"
    port: int = 22
    user: str | None = None
    key: str | None = None
    known_hosts: str | None = None
    timeout_s: float = 10.0
    become: bool = False
    accept_new_host_keys: bool = False
