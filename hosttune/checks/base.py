"""A check: fixed metadata plus a pure function from (facts, profile) to a verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from hosttune.probes.facts import Facts
from hosttune.checks.findings import Finding, Severity, Status, Verdict, show
from hosttune.config.profile import Profile


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    severity: Severity
    why: str  # one sentence: why this matters for serving
    remediation: str  # what `hosttune apply` does about it
    needs_reboot: bool
    evaluate: Callable[[Facts, Profile], Verdict]
    not_applicable: str = ""  # where the check reports not-applicable beyond the obvious (no GPU, no systemd), and why
    reads: tuple[str, ...] = ()  # the probe's sections its facts come from (hosttune/probes/script.sh)

    def run(self, facts: Facts, profile: Profile) -> Finding:
        try:
            verdict = unread_sections(self.evaluate(facts, profile), facts, self.reads)
        except Exception as exc:  # noqa: BLE001 - one broken parser must not hide the other checks
            verdict = Verdict(Status.ERROR, "-", detail=f"check failed on these facts: {type(exc).__name__}: {exc}")
        return Finding(
            check_id=self.id, title=self.title, status=verdict.status, severity=verdict.severity or self.severity,
            desired=verdict.desired, configured=verdict.configured, active=verdict.active,
            detail=verdict.detail, remediation=self.remediation, needs_reboot=self.needs_reboot, why=self.why,
            subjects=verdict.subjects,
        )


def unread_sections(verdict: Verdict, facts: Facts, reads: tuple[str, ...]) -> Verdict:
    """A judgement (ok, drift, pending reboot, or a host without the thing) made on defaults where a section it reads is
    not in the probe's output cannot be judged: the host was not read there. An error stands, and so does a setting
    the profile does not manage."""
    missing = [s for s in reads if s in facts.unread]
    if not missing or verdict.status is Status.ERROR or verdict.unmanaged:
        return verdict
    return Verdict(Status.ERROR, verdict.desired, None, None, f"the probe's output has no {', '.join(missing)} "
                   "section: what this check reads there is unknown")


def na(reason: str, desired: str = "-") -> Verdict:
    return Verdict(Status.NOT_APPLICABLE, desired, detail=reason)


def unmanaged(reason: str) -> Verdict:
    """not-applicable because the profile does not manage the setting, whatever the host is."""
    return Verdict(Status.NOT_APPLICABLE, "-", detail=reason, unmanaged=True)


def none_found(facts: Facts, what: str, reason: str) -> Verdict:
    """not-applicable for hardware or running state the host has none of (reason); an image has none of either to
    read, so it is told where `what` is read instead of being described as a host without it."""
    if facts.image:
        return na(f"an image: {what} is read on the running host (check it after the first boot)")
    return na(reason)


def has_gpus(facts: Facts) -> bool:
    return bool(facts.gpu.gpus or facts.gpu.pci_devices)


def gpu_unavailable(facts: Facts) -> Verdict | None:
    """not-applicable without NVIDIA hardware; error when the hardware is there but no driver answers."""
    if facts.gpu.gpus:
        return None
    if facts.gpu.pci_devices and not facts.image:
        return Verdict(Status.ERROR, "-", detail=f"NVIDIA GPUs on the PCI bus but NVML and nvidia-smi failed: {facts.gpu.error}")
    return none_found(facts, "GPU state", "no NVIDIA GPU on this host")


def unread(gpus: Iterable[object], *fields: str) -> list[str]:
    """'GPU0', ... of the GPUs of which none of `fields` was read (N/A, or not in the output of this driver's tools)."""
    return [f"GPU{g.index}" for g in gpus if all(getattr(g, f) is None for f in fields)]  # type: ignore[attr-defined]


def not_read(desired: str, active: str | None, what: str, gpus: list[str]) -> Verdict:
    """error: nothing wrong was read, and part of what the check judges was not read at all."""
    return Verdict(Status.ERROR, desired, None, active, f"no {what} read for {', '.join(gpus)} (NVML and nvidia-smi "
                   "gave none)")


def is_systemd(facts: Facts) -> bool:
    return facts.pid1 == "systemd"


def not_systemd(facts: Facts) -> str:
    """Why no boot unit can be written: the host's PID 1, or an image's /sbin/init (the build machine's is no part of it).
    The checks and the actions say it in these same words."""
    if facts.image:
        return f"the image's /sbin/init is {facts.pid1 or 'missing'}, not systemd"
    return f"PID 1 is {facts.pid1 or 'unknown'}, not systemd"


def image_verdict(desired: object, configured: object, detail: str = "") -> Verdict:
    """apply --root: an image has no running kernel, so a setting is judged on what it configures."""
    status = Status.OK if configured == desired else Status.DRIFT
    return Verdict(status, show(desired), show(configured), "-", detail or "an image: judged on its configuration alone")
