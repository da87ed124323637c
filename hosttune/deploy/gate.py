"""The health gate: wait for /health, send warmup requests, then one real one-token generation in time.

It runs on the host (gate_probe.py through the host's python3), so it needs no route from
this machine to the service port, and it watches the unit: a service that exits and is
restarted by systemd fails the gate at once instead of at the deadline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hosttune.deploy.settings import ServeSettings
from hosttune.errors import TransportError
from hosttune.transport.base import Transport, bundled_script

JOURNAL_LINES = 40


@dataclass(frozen=True)
class GateResult:
    ok: bool
    phase: str  # where it stopped: health | models | warmup | gate | done
    error: str = ""
    health_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float | None = None
    gate_s: float | None = None
    model: str = ""

    def summary(self) -> str:
        if not self.ok:
            return f"gate failed at {self.phase}: {self.error}"
        return (f"healthy after {self.health_s:.1f}s, warmup {self.warmup_requests} requests in {self.warmup_s:.1f}s, "
                f"one-token generation in {self.gate_s:.2f}s")


def gate_line(unit: str, settings: ServeSettings, fallback: str) -> str:
    """The gate of `unit` as a plan shows it; `fallback` is what a failed gate leads to."""
    return (f"gate {unit}: /health within {settings.health_timeout_s:g} s, {settings.warmup} warmup requests, "
            f"a one-token generation within {settings.gate_timeout_s:g} s; on failure {fallback}")


def gate_script() -> str:
    return bundled_script("hosttune.deploy", "host_key.py") + "\n\n" + bundled_script("hosttune.deploy", "gate_probe.py")


def parse_gate(text: str) -> GateResult:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        return GateResult(False, "health", f"the gate script printed no result: {text.strip()[-300:]}")
    doc = json.loads(lines[-1])
    warmup = doc.get("warmup") or {}
    return GateResult(bool(doc.get("ok")), doc.get("phase", "health"), doc.get("error", ""), doc.get("health_s"),
                      warmup.get("requests", 0), warmup.get("s"), doc.get("gate_s"), doc.get("model", ""))


def run_gate(transport: Transport, unit: str, settings: ServeSettings, health_path: str, *,
             warmup: int | None = None, just_started: bool = True, key_file: str | None = None) -> GateResult:
    """Wait until the service serves; raises nothing: a failure is a GateResult with ok=False.

    just_started: the unit was (re)started by this deploy, so any automatic restart is a crash;
    otherwise restarts before the gate began are history.
    key_file: the service's key file on the host; the script reads the key there and sends it,
    so the key is never in its arguments.
    """
    args = {"unit": unit, "port": settings.port, "health_path": health_path, "key_file": key_file,
            "health_timeout_s": settings.health_timeout_s, "gate_timeout_s": settings.gate_timeout_s,
            "warmup": settings.warmup if warmup is None else warmup, "restarts_baseline": 0 if just_started else None}
    limit = settings.health_timeout_s + settings.gate_timeout_s * (args["warmup"] + 2) + 30
    try:
        result = transport.read(["python3", "-c", gate_script(), json.dumps(args)], timeout=limit)
    except TransportError as exc:
        return GateResult(False, "health", str(exc))
    if not result.ok:
        return GateResult(False, "health", f"the gate script exited {result.rc}: {result.stderr.strip()[-400:]}")
    return parse_gate(result.stdout)


def journal_tail(transport: Transport, unit: str, lines: int = JOURNAL_LINES) -> str:
    """The unit's last log lines, for the operator to see why it failed."""
    result = transport.read(["journalctl", "--unit", unit, "--lines", str(lines), "--no-pager", "--output", "short-iso"],
                           timeout=60)
    return (result.stdout or result.stderr).rstrip()
