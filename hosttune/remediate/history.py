"""The remediation ledger kept on each host: every Xid seen (with when), and when each GPU was last recovered.

The kernel log only says how many Xid lines this boot has; the ledger turns that into
occurrences with a time, so repeats can be counted within a window across runs and boots.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, replace

from hosttune.actions.remediate import LEDGER_FILE
from hosttune.errors import HosttuneError
from hosttune.probes.facts_health import XidEvent
from hosttune.probes.machine import MachineIdentity, other_machine, recorded_gpus

KEEP_S = 7 * 24 * 3600  # occurrences older than this are dropped


@dataclass(frozen=True)
class Occurrence:
    bdf: str  # "0000:3b:00", as the kernel log names the GPU
    code: int
    at: float  # epoch seconds when a run first saw it


@dataclass(frozen=True)
class Ledger:
    boot: str = ""  # the boot the seen counts belong to
    seen: tuple[tuple[str, int, int], ...] = ()  # (bdf, code, lines in this boot's kernel log)
    xids: tuple[Occurrence, ...] = ()
    recovered: tuple[tuple[str, float], ...] = ()  # (bdf, when its last recovery finished)
    machine: str = ""  # the host's persistent /etc/machine-id when written ("": none, unknown, an older hosttune's)
    gpus: tuple[str, ...] = ()  # its GPUs' UUIDs when written (a machine whose id was made anew keeps them)

    def recovered_at(self, bdf: str) -> float:
        return dict(self.recovered).get(bdf, 0.0)

    def open_xids(self, bdf: str) -> tuple[Occurrence, ...]:
        """This GPU's occurrences since its last recovery."""
        since = self.recovered_at(bdf)
        return tuple(o for o in self.xids if o.bdf == bdf and o.at > since)

    def in_window(self, now: float, window_s: float) -> tuple[Occurrence, ...]:
        return tuple(o for o in self.xids if o.at >= now - window_s)

    def with_recovered(self, bdf: str, at: float) -> "Ledger":
        return replace(self, recovered=tuple(sorted({**dict(self.recovered), bdf: at}.items())))

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True, separators=(",", ":")) + "\n").encode()


class LedgerError(HosttuneError):
    """The ledger on a host cannot be read."""


def _time(raw: object) -> float:
    """Unix seconds; NaN or infinity would fall out of every window, and the Xids at it would never be counted."""
    at = float(raw)  # type: ignore[arg-type]
    if not math.isfinite(at):
        raise ValueError(f"a time must be a finite number of Unix seconds, got {raw}")
    return at


def parse_ledger(text: str) -> Ledger:
    if not text.strip():
        return Ledger()
    try:
        doc = json.loads(text)
        return Ledger(str(doc["boot"]), tuple((str(b), int(c), int(n)) for b, c, n in doc["seen"]),
                      tuple(Occurrence(str(o["bdf"]), int(o["code"]), _time(o["at"])) for o in doc["xids"]),
                      tuple((str(b), _time(t)) for b, t in doc["recovered"]), str(doc.get("machine") or ""),
                      recorded_gpus(doc.get("gpus")))
    except (ValueError, KeyError, TypeError, OverflowError) as exc:  # Overflow: int(Infinity)
        raise LedgerError(f"the remediation ledger {LEDGER_FILE} is not valid ({exc}): move it aside to start a new one") from None


def observe(ledger: Ledger, boot: str, events: tuple[XidEvent, ...], now: float,
            machine: MachineIdentity = MachineIdentity()) -> Ledger:
    """The ledger after reading this boot's kernel log: lines not counted before become occurrences at `now`.

    machine: the host's; a ledger another machine kept (a disk cloned from it) is not this host's history, and this
    one starts anew. One kept under another machine-id on these GPUs is this machine's: its id was made anew."""
    if other_machine(machine, MachineIdentity(ledger.machine, ledger.gpus)):
        ledger = Ledger()
    ledger = replace(ledger, machine=machine.machine_id or ledger.machine, gpus=machine.gpus or ledger.gpus)
    counts = Counter((e.bdf, e.code) for e in events)
    before = {(b, c): n for b, c, n in ledger.seen} if boot == ledger.boot else {}
    new = [Occurrence(bdf, code, now) for (bdf, code), n in sorted(counts.items())
           for _ in range(max(0, n - before.get((bdf, code), 0)))]
    kept = tuple(o for o in ledger.xids if o.at >= now - KEEP_S)
    seen = tuple((b, c, n) for (b, c), n in sorted(counts.items()))
    return replace(ledger, boot=boot, seen=seen, xids=kept + tuple(new))
