"""Checks of CPU frequency, idle states and kernel command-line settings."""

from __future__ import annotations

from hosttune import cores, cpulist
from hosttune.checks.base import Check, image_verdict, is_systemd, na, not_systemd, unmanaged
from hosttune.checks.boot_scripts import GOVERNOR_UNIT, NOT_PERSISTED, STALE_SCRIPT, governor_script, persisted, script_path
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict, judge, show
from hosttune.config.profile import Profile


def governor(facts: Facts, profile: Profile) -> Verdict:
    want = profile.cpu.governor
    if want is None:
        return unmanaged("CPU governor not managed by the profile")
    govs = facts.cpu.governors
    if facts.image and is_systemd(facts):
        configured = persisted(facts, GOVERNOR_UNIT, governor_script(want)) or want
        return image_verdict(want, configured, _stale_script(want) if configured == STALE_SCRIPT else "")
    if facts.image:
        return na(f"{not_systemd(facts)}: set the governor at boot another way", want)
    if not govs:
        return na("no cpufreq driver: frequency is controlled by firmware or the hypervisor", want)
    wrong = sorted(cpu for cpu, gov in govs.items() if gov != want)
    configured = None
    if is_systemd(facts):
        configured = persisted(facts, GOVERNOR_UNIT, governor_script(want)) or want
    active = want if not wrong else show(sorted(set(govs.values())))
    status = judge(want, configured, active, reboot=False)
    problems = [f"CPUs not in {want}: {cpulist.format(wrong)}"] if wrong else []
    problems += {NOT_PERSISTED: ["nothing sets the governor at boot"], STALE_SCRIPT: [_stale_script(want)]}.get(configured, [])
    return Verdict(status, want, configured, active, "; ".join(problems))


def _stale_script(want: str) -> str:
    return (f"{script_path(GOVERNOR_UNIT)} is not what apply would write for {want}: the next boot sets what it "
            "says (the profile changed since the last apply, or the file was edited)")


def _param_verdict(facts: Facts, params: dict[str, str], same=lambda a, b: a == b) -> Verdict:
    desired = " ".join(f"{k}={v}" for k, v in params.items())

    def state(configured: bool) -> str:
        return " ".join(f"{k}={facts.cmdline_param(k, configured) or '-'}" for k in params)

    def matches(configured: bool) -> bool:
        return all(same(facts.cmdline_param(k, configured), v) for k, v in params.items())

    active_ok = matches(False)
    if facts.image and facts.cmdline_configured is not None:
        return Verdict(Status.OK if matches(True) else Status.DRIFT, desired, state(True), "-",
                       f"an image: judged on {facts.cmdline_source} alone")
    if facts.cmdline_configured is None:
        status = Status.OK if active_ok else Status.DRIFT
        return Verdict(status, desired, None, state(False), "no bootloader configuration found; judged on /proc/cmdline")
    conf_ok = matches(True)
    status = judge(True, conf_ok, active_ok, reboot=True)
    return Verdict(status, desired, state(True), state(False), f"configured in {facts.cmdline_source}")


# cpuidle drivers of paravirtual guests: a vCPU that idles hands its core back to the hypervisor,
# whose C-states no intel_idle or processor limit on the guest's command line reaches.
GUEST_IDLE_DRIVERS = frozenset({"haltpoll"})
DEEP_EXIT_LATENCY_US = 10  # an idle state that takes longer to leave is deep


def deep_idle_states(facts: Facts) -> list[str]:
    """The enabled idle states of cpu0 that take more than DEEP_EXIT_LATENCY_US to leave."""
    return [name for name, disabled, latency in facts.cpu.idle_states if not disabled and latency > DEEP_EXIT_LATENCY_US]


def cstate_limit_moot(facts: Facts) -> str | None:
    """Why a C-state limit changes nothing on this host (no cpuidle driver, a paravirtual guest's), or None."""
    driver = facts.cpu.idle_driver
    if facts.cpu.count and driver in (None, "none"):
        return ("no cpuidle driver is active on this host (cpuidle/current_driver: "
                f"{driver or 'missing'}): the CPUs enter no idle states a limit could cap")
    if driver in GUEST_IDLE_DRIVERS and not deep_idle_states(facts):
        states = ", ".join(name for name, _, _ in facts.cpu.idle_states) or "none read"
        return (f"cpuidle driver {driver}: a paravirtual guest whose idle states ({states}) are all shallow; "
                "deep C-states are the hypervisor's, and no limit set in the guest reaches them")
    return None


def cstates(facts: Facts, profile: Profile) -> Verdict:
    """Deep idle states capped on the kernel command line and off now; not-applicable where no limit can matter."""
    limit = profile.cpu.max_cstate
    if limit is None:
        return unmanaged("C-states not managed by the profile")
    if moot := cstate_limit_moot(facts):
        return na(moot, f"max_cstate={limit}")
    verdict = _param_verdict(facts, {"intel_idle.max_cstate": str(limit), "processor.max_cstate": str(limit)})
    if deep := deep_idle_states(facts):
        note = f"deep idle states enabled now: {', '.join(deep)}"
        status = Status.DRIFT if verdict.status is Status.OK else verdict.status
        return Verdict(status, verdict.desired, verdict.configured, verdict.active, f"{verdict.detail}; {note}")
    return verdict


def rcu_nocbs(facts: Facts, profile: Profile) -> Verdict:
    setting = profile.kernel.rcu_nocbs
    if setting is None:
        return unmanaged("rcu_nocbs not managed by the profile")
    want = cores.rcu_nocbs(facts, setting)
    if want is None:
        read = "an image has none to read" if facts.image else "none were read"
        return na(f"rcu_nocbs: auto needs the host's CPUs, and {read}: set rcu_nocbs for these hosts in the inventory",
                  "rcu_nocbs=auto")
    if not want:
        return na(f"too few CPUs ({len(cores.online(facts))}) to offload RCU callbacks from any", "rcu_nocbs=auto")
    if missing := cores.beyond(facts, want):
        return Verdict(Status.ERROR, f"rcu_nocbs={cpulist.format(want)}", None, None,
                       f"CPUs {cpulist.format(missing)} are not on this host (online: {cpulist.format(cores.online(facts))}); "
                       "the kernel rejects such a list: set rcu_nocbs for this host in the inventory, or use auto")

    def same(value: str | None, desired: str) -> bool:
        try:
            return value is not None and cpulist.parse(value) == cpulist.parse(desired)
        except ValueError:
            return False

    return _param_verdict(facts, {"rcu_nocbs": cpulist.format(want)}, same)


CHECKS = (
    Check("cpu.governor", "CPU frequency governor", Severity.WARNING,
          "A power-saving governor ramps clocks up only after load arrives, adding latency to the first tokens.",
          "set scaling_governor=performance now and install a boot-time unit that sets it again", False, governor),
    Check("cpu.cstates", "CPU idle states", Severity.WARNING,
          "Waking a core from a deep C-state costs tens to hundreds of microseconds on every request burst.",
          "add intel_idle.max_cstate and processor.max_cstate to the kernel command line (grub drop-in), reboot; "
          "deep idle states are disabled now already", True, cstates,
          "a host with no active cpuidle driver (idle=poll, some VMs), and a VM guest whose cpuidle driver is a "
          "paravirtual one with only shallow states (haltpoll): deep C-states are the hypervisor's, no limit in the "
          "guest reaches them, and apply changes nothing for them"),
    Check("kernel.rcu_nocbs", "RCU callback offload", Severity.INFO,
          "RCU callbacks running on serving cores preempt the engine's scheduler thread at random.",
          "add rcu_nocbs=CPUS to the kernel command line (grub drop-in), reboot", True, rcu_nocbs),
)
