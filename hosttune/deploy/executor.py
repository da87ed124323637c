"""Carry out deploy operations on one host, in order; the first failure stops them.

Files and links change through hosttune.execute.remote (temp file + rename beside the
target, content hash checked on arrival), the same writer `hosttune apply` uses.
"""

from __future__ import annotations

from typing import Callable, Iterable

from hosttune.deploy.errors import DeployError
from hosttune.deploy.plan import Link, Op, Remove, Run, Upload, WriteFile, describe
from hosttune.execute.remote import hostops, write_file
from hosttune.transport.base import CommandResult, Transport


class OperationFailed(DeployError):
    """One deploy operation failed on a host."""


def run_op(transport: Transport, op: Op) -> CommandResult:
    if isinstance(op, Upload):
        return write_file(transport, op.path, op.local.read_bytes(), 0o644)
    if isinstance(op, WriteFile):
        return write_file(transport, op.path, op.content, op.mode)
    if isinstance(op, Link):
        return hostops(transport, "link", op.path, op.target, "")
    if isinstance(op, Remove):
        return hostops(transport, "remove", op.path)
    assert isinstance(op, Run)
    return transport.run(op.argv, timeout=op.timeout)


def _complains(op: Op, result: CommandResult) -> bool:
    return isinstance(op, Run) and any(word in result.stderr for word in op.fail_on_stderr)


def run_ops(transport: Transport, ops: Iterable[Op], on_op: Callable[[Op], None] | None = None) -> int:
    """Run every operation; returns how many ran. Raises OperationFailed naming the one that failed."""
    count = 0
    for op in ops:
        if on_op:
            on_op(op)
        result = run_op(transport, op)
        count += 1
        if not result.ok or _complains(op, result):
            output = (result.stderr.strip() or result.stdout.strip())[-1500:]
            raise OperationFailed(f"{transport.host_name}: {describe(op)} exited {result.rc}:\n{output}")
    return count
