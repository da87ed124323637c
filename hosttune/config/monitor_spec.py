"""The `monitor` section of a profile: hosttune on the host itself, its checks run by systemd timers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hosttune import __version__
from hosttune.config.monitor_wheels import missing_dependency
from hosttune.errors import ProfileError

MAX_INTERVAL_S = 7 * 86400  # a pass's timer runs at least weekly


@dataclass(frozen=True)
class MonitorSpec:
    """Checks on the host itself, all the time: hosttune in a virtualenv there, run by systemd timers.

    wheels: a folder on the controller with the hosttune wheel of this version and its dependencies
    (`pip wheel PATH-TO-HOSTTUNE -w DIR`), uploaded to the host: it needs no package index.
    """

    enabled: bool = False
    interval_s: int = 60  # the regular pass: every check, read-only, a few seconds
    active_interval_s: int | None = 3600  # the bounded --active pass (GPU load, dcgmi diag -r 1); None: none
    textfile_dir: str = "/var/lib/node_exporter/textfile_collector"  # node_exporter --collector.textfile.directory
    wheels: str | None = None

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ProfileError(f"monitor.enabled: must be true or false (got {self.enabled!r})")
        _seconds(self.interval_s, "monitor.interval_s", 10)
        if self.active_interval_s is not None:
            _seconds(self.active_interval_s, "monitor.active_interval_s", 300)
        if not isinstance(self.textfile_dir, str) or not re.fullmatch(r"/[A-Za-z0-9._/-]*", self.textfile_dir):
            raise ProfileError(f"monitor.textfile_dir: must be an absolute path (got {self.textfile_dir!r})")
        if self.wheels is not None:
            _wheels(self.wheels)


def _seconds(value: Any, where: str, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= MAX_INTERVAL_S:
        raise ProfileError(f"{where}: must be {least} to {MAX_INTERVAL_S} seconds (got {value!r})")


def _wheels(folder: str) -> None:
    """The folder must hold the hosttune wheel of this very version (what the host's check is judged against), and a
    wheel of each dependency it needs: the host installs from the folder alone."""
    wanted = f"hosttune-{__version__}-"
    if not Path(folder).is_dir():
        raise ProfileError(f"monitor.wheels: {folder} is not a folder; make it with `pip wheel PATH-TO-HOSTTUNE -w {folder}`")
    root = next((p for p in sorted(Path(folder).glob("*.whl")) if p.name.startswith(wanted)), None)
    if root is None:
        raise ProfileError(f"monitor.wheels: {folder} has no {wanted}*.whl; make it with `pip wheel PATH-TO-HOSTTUNE -w {folder}`")
    missing = missing_dependency(Path(folder), root)
    if missing:
        raise ProfileError(f"monitor.wheels: {folder} has no wheel of {missing[1]}, which {missing[0]} needs; make the "
                           f"folder with `pip wheel PATH-TO-HOSTTUNE -w {folder}`")
