"""Transports, picked from one registry by the host's transport name.

The SSH backend (and so paramiko) is imported only when a host uses it.
"""

from __future__ import annotations

from hosttune.errors import TransportError
from hosttune.transport.base import CommandResult, ConnectionSpec, Transport

__all__ = ["CommandResult", "ConnectionSpec", "Transport", "open_transport", "KINDS"]

KINDS = ("local", "ssh")


def open_transport(spec: ConnectionSpec, *, read_only: bool = False) -> Transport:
    """An (unconnected) transport for the host described by spec; `with open_transport(spec) as t:` closes it.

    read_only: the transport refuses `change` (check, plan and verify only read).
    """
    if spec.transport == "local":
        from hosttune.transport.local import LocalTransport

        return LocalTransport(spec.host_name, become=spec.become, read_only=read_only)
    if spec.transport == "ssh":
        from hosttune.transport.ssh import SshTransport

        return SshTransport(spec, read_only=read_only)
    raise TransportError(f"{spec.host_name}: unknown transport {spec.transport!r}; use one of {', '.join(KINDS)}")
