"""Xid events to ladders: NVIDIA's recovery action for each code, then repeats within a window.

- a fatal Xid (reset or reboot to recover) N times in the window on one GPU: the GPU keeps failing; drain and cordon
- otherwise a fatal Xid: drain and reset (reboot where a reset cannot recover it)
- an application Xid (13, 31, ...) twice on the same GPU: run the diagnostics on it
- the same on different GPUs: it points at the software; logged, no GPU is touched
- once, or an informational code: logged
"""

from __future__ import annotations

from dataclasses import dataclass

from hosttune.checks.xid_codes import Recovery, meaning, recovery
from hosttune.remediate.history import Ledger, Occurrence
from hosttune.remediate.rungs import Rung

GPU_LADDER = (Rung.DRAIN, Rung.RESET, Rung.REBOOT, Rung.CORDON)
REBOOT_LADDER = (Rung.DRAIN, Rung.REBOOT, Rung.CORDON)
DIAGNOSE_LADDER = (Rung.DRAIN, Rung.DIAGNOSE, Rung.RESET, Rung.REBOOT, Rung.CORDON)
RETIRE_LADDER = (Rung.DRAIN, Rung.CORDON)
LOG_LADDER = (Rung.LOG,)
FATAL = (Recovery.RESET_GPU, Recovery.REBOOT)


@dataclass(frozen=True)
class XidPolicy:
    window_s: float = 24 * 3600.0
    fatal_repeats: int = 5  # fatal Xids on one GPU within the window that retire it
    app_repeats: int = 2  # application Xids on one GPU within the window that call for diagnostics


@dataclass(frozen=True)
class XidVerdict:
    bdf: str
    ladder: tuple[Rung, ...]
    reason: str


def _codes(occurrences: tuple[Occurrence, ...]) -> str:
    codes = sorted({o.code for o in occurrences})
    return ", ".join(f"Xid {c} ({meaning(c)})" for c in codes)


def _of(occurrences: tuple[Occurrence, ...], bdf: str, kinds: tuple[Recovery, ...]) -> tuple[Occurrence, ...]:
    return tuple(o for o in occurrences if o.bdf == bdf and recovery(o.code) in kinds)


def _fatal(bdf: str, open_: tuple[Occurrence, ...], window: tuple[Occurrence, ...], policy: XidPolicy) -> XidVerdict | None:
    fatal_open = _of(open_, bdf, FATAL)
    if not fatal_open:
        return None
    repeats = _of(window, bdf, FATAL)
    hours = policy.window_s / 3600
    if len(repeats) >= policy.fatal_repeats:
        return XidVerdict(bdf, RETIRE_LADDER, f"{len(repeats)} fatal Xids in {hours:g} h ({_codes(repeats)}): the GPU keeps failing")
    reboot = _of(fatal_open, bdf, (Recovery.REBOOT,))
    return XidVerdict(bdf, REBOOT_LADDER if reboot else GPU_LADDER, _codes(fatal_open))


def _app(bdf: str, open_: tuple[Occurrence, ...], window: tuple[Occurrence, ...], policy: XidPolicy) -> XidVerdict | None:
    app_open = _of(open_, bdf, (Recovery.RESTART_APP,))
    if not app_open:
        return None
    here = _of(window, bdf, (Recovery.RESTART_APP,))
    others = sorted({o.bdf for o in window if o.bdf != bdf and recovery(o.code) is Recovery.RESTART_APP})
    if others:
        return XidVerdict(bdf, LOG_LADDER, f"{_codes(app_open)} here and on {', '.join(others)}: points at the software, not a GPU")
    if len(here) >= policy.app_repeats:
        return XidVerdict(bdf, DIAGNOSE_LADDER, f"{_codes(here)} {len(here)} times on this GPU: run its diagnostics")
    return XidVerdict(bdf, LOG_LADDER, f"{_codes(app_open)} once: an application fault, logged")


def classify(ledger: Ledger, now: float, policy: XidPolicy = XidPolicy()) -> list[XidVerdict]:
    """One verdict per GPU with Xids since its last recovery, in address order."""
    window = ledger.in_window(now, policy.window_s)
    verdicts = []
    for bdf in sorted({o.bdf for o in ledger.xids}):
        open_ = ledger.open_xids(bdf)
        if not open_:
            continue
        verdict = _fatal(bdf, open_, window, policy) or _app(bdf, open_, window, policy)
        verdicts.append(verdict or XidVerdict(bdf, LOG_LADDER, f"{_codes(open_)}: informational, logged"))
    return verdicts
