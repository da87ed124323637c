"""Run commands on this machine with subprocess."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Sequence

from hosttune.errors import CommandTimeout
from hosttune.transport.base import CommandResult, Transport, with_become


class LocalTransport(Transport):
    """The local machine; `become` uses sudo only when not already root."""

    def __init__(self, host_name: str = "localhost", become: bool = False, read_only: bool = False):
        self.host_name = host_name
        self.become = become and os.geteuid() != 0
        self.read_only = read_only

    def _command(self, argv: Sequence[str], stdin: bytes | None, timeout: float | None) -> CommandResult:
        full = with_become(argv, self.become)
        start = time.monotonic()
        try:
            proc = subprocess.run(
                full, input=stdin or b"", capture_output=True, timeout=timeout, check=False
            )
        except FileNotFoundError as exc:
            return CommandResult(full, 127, "", str(exc), time.monotonic() - start)
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(f"{self.host_name}: {argv[0]} timed out after {timeout}s") from exc
        return CommandResult(
            full,
            proc.returncode,
            proc.stdout.decode("utf-8", "surrogateescape"),
            proc.stderr.decode("utf-8", "surrogateescape"),
            time.monotonic() - start,
        )
