"""Which machine a host is: its persistent machine-id and its GPUs' UUIDs.

A file a host wrote earlier (a monitor status file, the remediation ledger) records them, so that one a disk cloned
from another host brought along is not read as this host's. A machine-id alone cannot say it: systemd makes one up at
a boot where /etc/machine-id is empty or says `uninitialized` and, where it cannot write it (a read-only or stateless
root), mounts it over the file from /run, a new one at every boot; and some images write a new one at every boot.
Such an id names no machine. A machine whose id changed keeps its GPUs; a clone runs on another machine's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from hosttune.probes.facts import Facts

_ID = re.compile(r"[0-9a-f]{32}")
_TRANSIENT_FS = ("tmpfs", "ramfs")  # what a made-up id sits on: /run's tmpfs mounted over the file, or a tmpfs root


@dataclass(frozen=True)
class MachineIdentity:
    machine_id: str = ""  # a persistent /etc/machine-id; "" none (empty, uninitialised, made up at boot) or unknown
    gpus: tuple[str, ...] = ()  # the GPUs' UUIDs, sorted; () none or unknown


def is_transient(mounted: bool, fstype: str) -> bool:
    """/etc/machine-id is gone at the next boot: a file mounted over it, or it lives on a tmpfs root."""
    return mounted or fstype in _TRANSIENT_FS


def persistent_id(raw: str, transient: bool | None = False) -> str:
    """/etc/machine-id's first line where it is a machine-id kept on disk; else "" (it names no machine)."""
    value = raw.strip()
    return "" if transient or not _ID.fullmatch(value) else value


def _names_gpu(uuid: str) -> bool:
    body = uuid[4:]
    return uuid.startswith("GPU-") and "?" not in body and bool(body.strip("0-"))


def gpu_uuids(uuids: Iterable[str]) -> tuple[str, ...]:
    """The UUIDs that name a GPU: a driver that has not initialised one prints GPU-????????-..., a recording zeros."""
    return tuple(sorted({u.strip() for u in uuids if _names_gpu(u.strip())}))


def recorded_gpus(raw: object) -> tuple[str, ...]:
    """The GPU UUIDs a file recorded (a list, or nothing); ValueError for anything else."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(u, str) for u in raw):
        raise ValueError(f"gpus: must be a list of GPU UUIDs (got {str(raw)[:60]!r})")
    return tuple(raw)


def identity(facts: Facts) -> MachineIdentity:
    return MachineIdentity(persistent_id(facts.machine_id, facts.machine_id_transient),
                           gpu_uuids(g.uuid for g in facts.gpu.gpus))


def other_machine(here: MachineIdentity, there: MachineIdentity) -> bool:
    """What `there` recorded is another machine's (False where it is this one's, or nobody can tell). Machine-ids
    that differ on the same GPUs are one machine whose id was made anew (at a boot, by its image)."""
    if not here.machine_id or not there.machine_id or here.machine_id == there.machine_id:
        return False
    return not set(here.gpus) & set(there.gpus)
