"""Actions: failing findings → steps. Pure functions of (facts, profile, host); nothing runs here.

ACTIONS maps a check id to the functions that fix it. A function may serve several checks
(the kernel command line serves C-states, rcu_nocbs, NVMe and THP), so it is called once
per host and each of its steps keeps only the failing checks it fixes.
"""

from __future__ import annotations

from typing import Callable

from hosttune.actions import cpu, cuda, gpu, irq, kernel, memory, monitor, packages
from hosttune.actions.base import Step, blocked
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Finding, Status
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile

Action = Callable[[Facts, Profile, Host], list[Step]]

ACTIONS: dict[str, tuple[Action, ...]] = {
    "driver.version": (packages.driver_version,),
    "driver.held": (packages.driver_held,),
    "cuda.toolkit": (cuda.cuda_toolkit,),
    "gpu.persistence": (gpu.persistence,),
    "gpu.ecc": (gpu.ecc,),
    "gpu.mig": (gpu.mig,),
    "cpu.governor": (cpu.governor,),
    "cpu.cstates": (kernel.kernel_cmdline,),
    "kernel.rcu_nocbs": (kernel.kernel_cmdline,),
    "nvme.power": (kernel.kernel_cmdline,),
    "irq.irqbalance": (irq.irqbalance,),
    "irq.gpu_affinity": (irq.gpu_affinity,),
    "numa.topology": (memory.numa_balancing,),
    "mm.thp": (memory.thp, kernel.kernel_cmdline),
    "tools.numactl": (packages.numactl,),
    "python.version": (packages.python_version,),
    "monitor.installed": (monitor.monitor,),
}


def steps_for(findings: list[Finding] | tuple[Finding, ...], facts: Facts, profile: Profile, host: Host,
              statuses: tuple[Status, ...] = (Status.DRIFT,)) -> list[Step]:
    """The steps that fix every drifting finding; findings without an action get a blocked step.

    pending-reboot findings get none: their configuration is right already. For an image
    (--root) the host's own state says nothing about the image, so `statuses` then takes
    every managed setting (ok and pending-reboot too); the plan drops what the image has.
    """
    drifting = [f for f in findings if f.status in statuses]
    failing = {f.check_id for f in drifting}
    called: list[Action] = []
    steps: list[Step] = []
    for finding in drifting:
        actions = ACTIONS.get(finding.check_id, ())
        if not actions and finding.status is Status.DRIFT:
            steps.append(blocked(finding.check_id, f"no automatic fix: {finding.remediation}"))
        for action in actions:
            if action in called:
                continue
            called.append(action)
            steps += _keep_failing(action(facts, profile, host), failing)
    return steps + _unjudged(findings)


def _unjudged(findings) -> list[Step]:
    """Findings in error (a setting naming CPUs the host lacks, a check that could not read its facts): apply
    cannot fix what was not judged, and its plan says so rather than leave them out. One step per reason."""
    by_reason: dict[str, list[str]] = {}
    for finding in findings:
        if finding.status is Status.ERROR:
            by_reason.setdefault(finding.detail or "the check could not judge it", []).append(finding.check_id)
    return [Step(tuple(ids), "no automatic fix", blocked=f"not judged: {reason}") for reason, ids in by_reason.items()]


def _keep_failing(steps: list[Step], failing: set[str]) -> list[Step]:
    kept = []
    for step in steps:
        fixes = tuple(c for c in step.fixes if c in failing)
        if fixes:
            kept.append(Step(fixes, step.summary, step.ops, step.needs_reboot, step.notes, step.blocked, step.opt_in))
    return kept
