"""Host-side file operations as argv: hostops.sh does the work, values travel as arguments."""

from __future__ import annotations

import hashlib
import re

from hosttune.errors import HosttuneError
from hosttune.transport.base import CommandResult, Transport, image_script

OP_TIMEOUT_S = 120.0


def hostops_script() -> str:
    return image_script("hosttune.execute", "hostops.sh")


def hostops_argv(op: str, *args: str, root: str | None = None) -> list[str]:
    """hostops.sh's argv; with an image root, its paths under the root are resolved inside the image."""
    image = ["-r", root] if root and root != "/" else []
    return ["sh", "-c", hostops_script(), "hosttune", *image, op, *args]


def hostops(transport: Transport, op: str, *args: str, stdin: bytes | None = None,
            timeout: float = OP_TIMEOUT_S, root: str | None = None) -> CommandResult:
    return transport.change(hostops_argv(op, *args, root=root), stdin=stdin, timeout=timeout)


def write_file(transport: Transport, path: str, content: bytes, mode: int, *, backup: str = "",
               expected: str = "", root: str | None = None) -> CommandResult:
    """Atomically make path hold content (temp file + rename beside it), backing up what was there.

    expected: the sha256 (or "absent") the file must still have, else nothing is written.
    """
    digest = hashlib.sha256(content).hexdigest()
    return hostops(transport, "write", path, f"{mode:04o}", digest, backup, expected, stdin=content, root=root)


def kernel_write(transport: Transport, paths: tuple[str, ...], value: str) -> CommandResult:
    return transport.change(["tee", "--", *paths], stdin=(value + "\n").encode(), timeout=OP_TIMEOUT_S)


_JOURNAL = re.compile(r"^@@journal:(?P<name>[\w.:-]+\.json)$", re.M)


def read_journals(transport: Transport, runs_dir: str, root: str = "") -> dict[str, str]:
    """{file name: JSON text} of every journal in runs_dir (under the image root, when one is given).

    A root that is no OS root (not there, an empty mount point) or a folder that cannot be read raises: that is not
    "no runs"."""
    argv = hostops_argv("journals", runs_dir, root=root)
    result = transport.read(argv, timeout=OP_TIMEOUT_S)
    if not result.ok:
        raise HosttuneError(result.stderr.strip().removeprefix("hosttune: ") or f"cannot read {runs_dir}")
    parts = _JOURNAL.split(result.stdout)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
