"""The rungs of the remediation ladder, lowest first, and what each does (`hosttune explain remediate.RUNG`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from hosttune.errors import HosttuneError


class Rung(IntEnum):
    """One step of the ladder; a higher rung takes more out of service."""

    LOG = 0
    RESTART = 1
    DRAIN = 2
    DIAGNOSE = 3
    RESET = 4
    REBOOT = 5
    CORDON = 6

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class RungDoc:
    what: str  # what the rung does on the host
    clears: str  # when the re-check after it counts the fault as fixed
    undo: str  # how it is undone


DOCS = {
    Rung.LOG: RungDoc(
        "records the fault in the host's ledger (/var/lib/hosttune/remediate/ledger.json) and changes nothing else",
        "always: a logged fault needs no action until it repeats", "nothing to undo"),
    Rung.RESTART: RungDoc(
        "systemctl restart of the failed unit (an engine unit or replica, nvidia-fabricmanager)",
        "the unit is active again", "nothing to undo: the unit was down"),
    Rung.DRAIN: RungDoc(
        "takes the replicas on the affected GPU out of the host's nginx front (no new requests), waits a bounded time "
        "for their in-flight requests to finish, then stops them so the GPU is free",
        "never for a GPU fault (draining only makes the next rung safe)",
        "hosttune rollback --run RUN puts them back: started, then back in nginx"),
    Rung.DIAGNOSE: RungDoc(
        "runs DCGM's diagnostics on the drained GPU (dcgmi diag -r 2 -i N)",
        "the diagnostics pass; the GPU's replicas are started and put back in the front", "nothing to undo"),
    Rung.RESET: RungDoc(
        "resets the drained GPU (nvidia-smi -r -i N), only when no process holds it",
        "the GPU is back with no new Xid and no pending remap (for a replica's unit fault: its replica, started and "
        "back in the front, runs); its replicas are started and put back in the front",
        "nothing to undo: the reset itself changes no setting"),
    Rung.REBOOT: RungDoc(
        "reboots the host and waits for it to answer from a new boot (only with --reboot, and never the machine hosttune runs on)",
        "the fault is gone after the boot", "nothing to undo"),
    Rung.CORDON: RungDoc(
        "writes /var/lib/hosttune/cordon.json and takes every replica out of the host's front (stops the service of a "
        "host without replicas): deploy refuses the host and it serves nothing; the circuit breaker "
        "(--max-cordoned-percent) can refuse it",
        "never: the host waits for a person", "hosttune uncordon (or hosttune rollback --run RUN)"),
}


def rung_named(name: str) -> Rung:
    try:
        return Rung[name.upper()]
    except KeyError:
        raise HosttuneError(f"unknown remediation step {name!r}; known: {', '.join(str(r) for r in Rung)}") from None


def explain_lines(rung: Rung) -> list[str]:
    doc = DOCS[rung]
    return [f"remediate.{rung}: rung {int(rung)} of the remediation ladder",
            f"does: {doc.what}", f"fixed when: {doc.clears}", f"undo: {doc.undo}"]
