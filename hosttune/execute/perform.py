"""One operation onto a host: the only code that turns an operation into a changing command.

An apply runs its operations with their journal records (backups, the state each expects to
find, under `--root` when given); a deploy runs its operations bare and in order, the first
failure stopping them (its releases and the `previous` link are how it goes back).
"""

from __future__ import annotations

from typing import Callable, Iterable

from hosttune.actions.base import Command, Directory, FileWrite, KernelWrite, Op, Remove, Service, Symlink, describe
from hosttune.errors import HosttuneError
from hosttune.execute.journal import OpRecord
from hosttune.execute.remote import hostops, kernel_write, write_file
from hosttune.plan.state import rooted
from hosttune.transport.base import CommandResult, Transport


class OperationFailed(HosttuneError):
    """One operation failed on a host; the message names it and gives its output."""


def perform(t: Transport, op: Op, rec: OpRecord | None = None, root: str | None = None) -> CommandResult:
    """Run one operation; with a journal record, back up what it replaces (a removed path is moved aside)."""
    backup = rooted(root, rec.backup) if rec and rec.backup else ""
    if isinstance(op, FileWrite):
        expected = (rec.sha_before or "") if rec else ""
        return write_file(t, rooted(root, op.path), op.body(), op.mode, backup=backup, expected=expected, root=root)
    if isinstance(op, Symlink):
        return hostops(t, "link", rooted(root, op.path), op.target, backup, root=root)
    if isinstance(op, Directory):  # prints "created:DIR" for each one it made (rollback removes them)
        return hostops(t, "mkdirs", rooted(root, op.path), root=root)
    if isinstance(op, Remove):
        if rec:
            return hostops(t, "move", rooted(root, op.path), rooted(root, rec.target), root=root)
        return hostops(t, "remove", rooted(root, op.path), root=root)
    if isinstance(op, KernelWrite):
        return kernel_write(t, op.paths, op.value)
    if isinstance(op, Service):
        return t.change(("systemctl", f"--root={root}", *op.argv[1:]) if root else op.argv)
    assert isinstance(op, Command), f"unresolved operation: {op!r}"
    return t.change(("chroot", root, *op.argv) if root else op.argv, timeout=op.timeout)


def failed(op: Op, result: CommandResult) -> bool:
    """A non-zero exit, or a command's exit 0 whose stderr or stdout names one of its failure words."""
    if not result.ok:
        return True
    return isinstance(op, Command) and (any(word in result.stderr for word in op.fail_on_stderr)
                                        or any(word in result.stdout for word in op.fail_on_stdout))


def run_ops(transport: Transport, ops: Iterable[Op], on_op: Callable[[Op], None] | None = None) -> int:
    """Run every operation in order; returns how many ran. Raises OperationFailed naming the one that failed."""
    count = 0
    for op in ops:
        if on_op:
            on_op(op)
        result = perform(transport, op)
        count += 1
        if failed(op, result):
            output = (result.stderr.strip() or result.stdout.strip())[-1500:]
            raise OperationFailed(f"{transport.host_name}: {describe(op)} exited {result.rc}:\n{output}")
    return count
