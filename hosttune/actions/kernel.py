"""Kernel command line (C-states, rcu_nocbs, NVMe APST, THP) through the platform's boot loader."""

from __future__ import annotations

from hosttune import cores, cpulist
from hosttune.actions.base import KernelWrite, Step
from hosttune.actions.platform import select
from hosttune.checks.cpu import DEEP_EXIT_LATENCY_US, cstate_limit_moot
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile

# Which check each kernel parameter serves.
PARAM_CHECKS = {
    "intel_idle.max_cstate": "cpu.cstates", "processor.max_cstate": "cpu.cstates", "rcu_nocbs": "kernel.rcu_nocbs",
    "nvme_core.default_ps_max_latency_us": "nvme.power", "transparent_hugepage": "mm.thp",
}


def kernel_params(facts: Facts, profile: Profile) -> tuple[str, ...]:
    """Every kernel parameter the profile manages, in a stable order."""
    params: list[str] = []
    if profile.cpu.max_cstate is not None and not cstate_limit_moot(facts):
        params += [f"intel_idle.max_cstate={profile.cpu.max_cstate}", f"processor.max_cstate={profile.cpu.max_cstate}"]
    nocbs = cores.rcu_nocbs(facts, profile.kernel.rcu_nocbs)
    if nocbs and not cores.beyond(facts, nocbs):
        params.append(f"rcu_nocbs={cpulist.format(nocbs)}")
    if profile.nvme.apst is False and facts.nvme:
        params.append("nvme_core.default_ps_max_latency_us=0")
    thp = facts.cmdline_param("transparent_hugepage", configured=True)
    if profile.memory.thp and thp not in (None, profile.memory.thp):
        params.append(f"transparent_hugepage={profile.memory.thp}")  # the boot line would override the sysfs unit
    return tuple(params)


def _deep_idle_off(facts: Facts) -> KernelWrite | None:
    """Disable deep idle states now on every CPU (the command line does it from the next boot)."""
    names = sorted(f"state{i}" for i in range(len(facts.cpu.idle_states)))
    deep = [state for state, (_, disabled, latency) in zip(names, facts.cpu.idle_states)
            if not disabled and latency > DEEP_EXIT_LATENCY_US]
    if not deep:
        return None
    paths = tuple(f"/sys/devices/system/cpu/cpu{c}/cpuidle/{s}/disable" for c in range(facts.cpu.count) for s in deep)
    return KernelWrite(paths, "1")


def _nvme_awake(facts: Facts) -> KernelWrite | None:
    asleep = [d.name for d in facts.nvme if d.power_state not in (None, "D0")]
    if not asleep:
        return None
    return KernelWrite(tuple(f"/sys/class/nvme/{n}/device/power/control" for n in asleep), "on")


def kernel_cmdline(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """Kernel parameters via a grub drop-in + update-grub (grubby on RHEL-likes); pending reboot after.

    Also what can be done live: deep idle states disabled and sleeping NVMe devices woken.
    """
    params = kernel_params(facts, profile)
    fixes = tuple(dict.fromkeys(PARAM_CHECKS[p.partition("=")[0]] for p in params))
    platform = select(facts)
    steps = []
    if params and platform.boot is None:
        steps.append(Step(fixes, "no automatic fix", blocked=f"{platform.why_no_boot}; add {' '.join(params)} to the kernel command line by hand"))
    elif params:
        steps.append(platform.kernel_params_step(fixes, params, facts))
    if live := _deep_idle_off(facts):
        steps.append(Step(("cpu.cstates",), "deep CPU idle states disabled now", (live,)))
    if live := _nvme_awake(facts):
        steps.append(Step(("nvme.power",), "NVMe devices kept in D0 now (runtime power management off)", (live,)))
    return steps
