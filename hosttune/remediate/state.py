"""What the ladder needs to know about a host besides its facts: its replicas and their GPUs, its unit
states, whether it is cordoned, and its ledger. One read-only round trip (state.sh)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hosttune.actions.remediate import CORDON_FILE
from hosttune.errors import ProbeError
from hosttune.remediate.history import Ledger, parse_ledger
from hosttune.transport.base import Transport, bundled_script

LATEST_TIME = 253402300800.0  # 10000-01-01: past it, a time cannot be printed as a date


@dataclass(frozen=True)
class Replica:
    index: int
    port: int
    gpus: tuple[int, ...]

    @property
    def unit(self) -> str:
        return f"hosttune-engine@{self.index}.service"


@dataclass(frozen=True)
class Cordon:
    at: float
    reason: str
    run: str = ""


@dataclass(frozen=True)
class HostSnapshot:
    boot: str = ""
    cordon: Cordon | None = None
    ledger: Ledger = field(default_factory=Ledger)
    replicas: tuple[Replica, ...] = ()
    lb_script: str | None = None  # the live release's replica_lb.py
    units: dict[str, str] = field(default_factory=dict, hash=False)  # engine unit -> systemctl is-active

    def replicas_on(self, gpu: int) -> tuple[Replica, ...]:
        return tuple(r for r in self.replicas if gpu in r.gpus)

    @property
    def services(self) -> tuple[str, ...]:
        """A host without replicas: the engine's own units (one service, or Ray's), which no front can take out."""
        return () if self.replicas else tuple(u for u in self.units if not u.startswith("hosttune-engine@"))


REPLICAS_FILE = "/opt/hosttune/current/.hosttune/replicas.json"  # state.sh reads it there
CORDON_FIX = "fix it, or remove it to uncordon the host"
REPLICAS_FIX = "deploy the release again to rewrite it"


def _json(what: str, value: str, fix: str) -> dict:
    """A state file's one JSON object; what: the file, as the error names it; fix: what to do when it is not one."""
    if not value.strip():
        raise ProbeError(f"{what} is not a JSON object (it is empty); {fix}")
    try:
        doc = json.loads(value)
    except ValueError as exc:
        raise ProbeError(f"{what} is not JSON ({exc}); {fix}") from None
    if not isinstance(doc, dict):
        kind = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(doc), "a number")
        raise ProbeError(f"{what} is not a JSON object (it is {kind}); {fix}")
    return doc


def _cordon_time(raw: object) -> float | None:
    """Unix seconds a clock can show, or None (missing, a boolean, a date string, NaN, infinity, past year 9999)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return None
    try:
        at = float(raw)
    except ValueError:
        return None
    return at if 0 < at < LATEST_TIME else None


def parse_cordon(value: str) -> Cordon:
    doc = _json(f"the host's cordon file {CORDON_FILE}", value, CORDON_FIX)
    at = _cordon_time(doc.get("at"))
    if at is None:
        raise ProbeError(f"the host's cordon file {CORDON_FILE}: at must be Unix time in seconds "
                         f"(got {doc.get('at')!r}); {CORDON_FIX}")
    return Cordon(at, str(doc.get("reason", "")), str(doc.get("run", "")))


def _replicas(value: str) -> tuple[Replica, ...]:
    doc = _json(f"the live release's {REPLICAS_FILE}", value, REPLICAS_FIX)
    try:
        return tuple(Replica(int(r["index"]), int(r["port"]), tuple(int(g) for g in r.get("gpus", ()))) for r in doc["replicas"])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # Overflow: int(Infinity)
        raise ProbeError(f"the live release's {REPLICAS_FILE} is not a list of replicas with index, port and gpus "
                         f"({type(exc).__name__}: {exc}); {REPLICAS_FIX}") from None


def parse_snapshot(text: str, with_ledger: bool = True) -> HostSnapshot:
    """with_ledger False: the ledger is left unread (uncordon needs none, and a broken one must not keep a host out)."""
    values: dict[str, str] = {}
    units: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "unit":
            name, _, active = value.partition(" ")
            units[name] = active
        else:
            values[key] = value
    return HostSnapshot(values.get("boot", ""), parse_cordon(values["cordon"]) if "cordon" in values else None,
                        parse_ledger(values.get("ledger", "") if with_ledger else ""), _replicas(values["replicas"]) if "replicas" in values else (),
                        values.get("lb") or None, units)


def read_snapshot(transport: Transport, with_ledger: bool = True) -> HostSnapshot:
    script = bundled_script("hosttune.remediate", "state.sh")
    return parse_snapshot(transport.read_script(script, what="reading the serving state for remediation"), with_ledger)
