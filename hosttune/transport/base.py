"""What every transport offers: run an argument vector (with optional stdin) on its host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

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


class Transport(Protocol):
    """A connection to one host. Commands are argument vectors, never shell strings."""

    host_name: str

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult: ...

    def close(self) -> None: ...


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
