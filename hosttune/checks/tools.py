"""Checks that what deploy needs is installed: numactl, the pinned Python."""

from __future__ import annotations

from hosttune.checks.base import Check, unmanaged
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile


def numactl(facts: Facts, profile: Profile) -> Verdict:
    if not profile.tools.numactl:
        return unmanaged("numactl not required by the profile")
    status = Status.OK if facts.numactl else Status.DRIFT
    return Verdict(status, "installed", None, facts.numactl or "missing",
                   "" if facts.numactl else "deploy pins engines to their GPU's NUMA node with numactl")


def python_version(facts: Facts, profile: Profile) -> Verdict:
    want = profile.tools.python
    if want is None:
        return unmanaged("no Python pin")
    have = facts.python_version or ""
    found = have.startswith(want + ".") or have == want or f"python{want}" in facts.pythons
    active = ", ".join(facts.pythons) or have or "missing"
    return Verdict(Status.OK if found else Status.DRIFT, want, None, active,
                   "" if found else f"python{want} not found (python3 is {have or 'missing'})")


CHECKS = (
    Check("tools.numactl", "numactl", Severity.WARNING,
          "Without numactl the engine cannot be bound to its GPU's NUMA node and pays cross-node memory traffic.",
          "install the numactl package", False, numactl),
    Check("python.version", "Pinned Python", Severity.WARNING,
          "Engine wheels are built for one Python ABI; another interpreter cannot load them.",
          "install the pinned Python version", False, python_version),
)
