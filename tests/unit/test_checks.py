"""Checks as data: these facts and this profile give these statuses."""

from dataclasses import replace

import pytest

from hosttune.checks import BY_ID, CATALOGUE, get_check, run_checks
from hosttune.errors import HosttuneError
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Status
from hosttune.config.inventory import Host, Pins
from hosttune.config.profile import load_profile, profile_for
from hosttune.transport.base import ConnectionSpec


def statuses(facts, profile):
    return {f.check_id: f.status for f in run_checks(facts, profile)}


def host(**pins):
    return Host("h", "g", ConnectionSpec("h"), pins=Pins(**pins), irq_cores="0-3")


def test_catalogue_covers_design():
    assert set(BY_ID) == {
        "driver.version", "driver.held", "cuda.toolkit", "cuda.driver_compat", "gpu.pstate",
        "gpu.persistence", "gpu.pcie_link", "gpu.ecc", "gpu.mig", "cpu.governor", "cpu.cstates",
        "kernel.rcu_nocbs", "irq.irqbalance", "irq.gpu_affinity", "numa.topology", "mm.thp",
        "nvme.power", "tools.numactl", "python.version",
        "gpu.xid", "gpu.count", "cuda.smoke", "gpu.memory_health", "gpu.nvlink", "gpu.fabric", "pci.p2p",
        "pci.aer", "gpu.clocks_power", "sys.shm", "sys.machine_id", "gpu.load", "gpu.diag", "gpu.allreduce", "serve.api_key",
        "serve.units", "serve.health", "serve.front", "monitor.installed", "monitor.stale",
    }
    assert all(c.why.endswith(".") and c.remediation for c in CATALOGUE)


def test_a100_findings(a100):
    s = statuses(a100, load_profile("inference-latency"))
    assert s["driver.version"] is Status.OK  # pinned 535.129.03, module = library
    assert s["driver.held"] is Status.DRIFT  # libnvidia-compute and cuda-toolkit not held
    assert s["cuda.toolkit"] is Status.DRIFT  # CUDA 11.8 first on PATH
    assert s["cuda.driver_compat"] is Status.DRIFT  # 12.4 on 535: minor-version compatibility only
    assert s["gpu.pstate"] is Status.DRIFT  # GPU3 in P2 under load, GPU1 lowered power cap
    assert s["gpu.persistence"] is Status.DRIFT  # GPU2 off
    assert s["gpu.pcie_link"] is Status.DRIFT  # GPU0 x8, GPU3 Gen3 under load
    assert s["gpu.ecc"] is Status.DRIFT  # GPU2 pending retirement
    assert s["gpu.mig"] is Status.OK
    assert s["cpu.governor"] is Status.DRIFT  # CPUs 60-63 powersave, no boot unit
    assert s["cpu.cstates"] is Status.OK
    assert s["kernel.rcu_nocbs"] is Status.DRIFT  # set to 4-63; auto keeps 0-1 and 32-33 (two nodes of 32)
    assert s["irq.irqbalance"] is Status.OK  # masked and not running
    assert s["irq.gpu_affinity"] is Status.DRIFT
    assert s["numa.topology"] is Status.DRIFT  # live 1, sysctl.d 0
    assert s["nvme.power"] is Status.DRIFT  # nvme1 in D3hot
    assert s["tools.numactl"] is Status.OK and s["python.version"] is Status.OK


def test_a100_details_name_the_culprits(a100):
    found = {f.check_id: f for f in run_checks(a100, load_profile("inference-latency"))}
    assert "/usr/local/cuda-11.8" in found["cuda.toolkit"].detail
    assert "minor-version compatibility" in found["cuda.driver_compat"].detail
    assert "GPU1 capped by a lowered power limit 300 W" in found["gpu.pstate"].detail
    assert "GPU3 in P2" in found["gpu.pstate"].detail
    assert "GPU0 link x8 of x16" in found["gpu.pcie_link"].detail
    assert "60-63" in found["cpu.governor"].detail
    assert "GPU2 → node 1 → CPUs 32-63" in found["numa.topology"].detail
    # irq_cores 0-3: GPUs 2 and 3 have IRQs on 32-35 and 0-63
    assert "IRQ 128 on 32-35" in found["irq.gpu_affinity"].detail


def test_numa_local_affinity(a100):
    profile = load_profile("inference-throughput")  # gpu_affinity: numa-local
    finding = BY_ID["irq.gpu_affinity"].run(a100, profile)
    assert finding.status is Status.DRIFT
    assert "0000:b1:00.0: 32-63" in finding.desired
    assert "IRQ 134 on 0-63" in finding.detail and "IRQ 120" not in finding.detail


def test_irqbalance_running_and_deep_cstates(l40s):
    s = statuses(l40s, load_profile("inference-latency"))
    assert s["irq.irqbalance"] is Status.DRIFT
    assert s["cpu.cstates"] is Status.PENDING_REBOOT  # grub has it, /proc/cmdline not yet
    assert s["cpu.governor"] is Status.DRIFT
    assert s["driver.version"] is Status.ERROR  # device on the bus, no driver answering
    assert s["gpu.pstate"] is Status.ERROR
    assert s["tools.numactl"] is Status.DRIFT
    assert s["mm.thp"] is Status.DRIFT


def test_h200_is_what_it_is(h200):
    profile = profile_for(host(driver="580.159.04", cuda="13.0", python="3.12"))
    s = statuses(h200, profile)
    assert s["driver.version"] is Status.OK and s["cuda.driver_compat"] is Status.OK
    assert s["gpu.ecc"] is Status.OK and s["gpu.mig"] is Status.OK and s["gpu.pcie_link"] is Status.OK
    assert s["irq.gpu_affinity"] is Status.DRIFT  # IRQs on 0-15, wanted 0-3
    assert s["nvme.power"] is Status.NOT_APPLICABLE and s["irq.irqbalance"] is Status.OK


def test_h200_findings_from_its_own_cpus(h200):
    """The recorded H200 VM: 16 CPUs in one node, no cpuidle driver, CUDA math libraries held."""
    found = {f.check_id: f for f in run_checks(h200, profile_for(Host("h", "g", ConnectionSpec("h"), pins=Pins("580.159.04", "13.0", "3.12"))))}
    assert found["cpu.cstates"].status is Status.NOT_APPLICABLE and "no cpuidle driver" in found["cpu.cstates"].detail
    assert found["kernel.rcu_nocbs"].desired == "rcu_nocbs=2-15"  # never past CPU 15
    assert found["irq.gpu_affinity"].desired == "0000:00:06.0: 0-1"
    assert "IRQ 42 on 0-15" in found["irq.gpu_affinity"].detail
    held = found["driver.held"]
    assert "libcublas-13-0, libcublas-dev-13-0, libcudnn9-cuda-13, libnccl-dev, libnccl2" in held.active
    assert "libcublas" not in held.detail and "cuda-nvcc-13-0" in held.detail  # held libraries are not reported unheld


def test_explicit_core_lists_past_the_hosts_cpus_are_errors(h200):
    profile = profile_for(Host("h", "g", ConnectionSpec("h"), irq_cores="0-3,32", rcu_nocbs="4-63"))
    found = {f.check_id: f for f in run_checks(h200, profile)}
    assert found["kernel.rcu_nocbs"].status is Status.ERROR and "CPUs 16-63 are not on this host" in found["kernel.rcu_nocbs"].detail
    assert found["irq.gpu_affinity"].status is Status.ERROR and "CPUs 32 are not on this host" in found["irq.gpu_affinity"].detail


def test_no_gpu_is_not_applicable():
    s = statuses(Facts(), load_profile("inference-latency"))
    for check_id in ("driver.version", "gpu.pstate", "gpu.persistence", "gpu.ecc", "irq.gpu_affinity"):
        assert s[check_id] is Status.NOT_APPLICABLE


def test_driver_library_mismatch(a100):
    mismatched = replace(a100, gpu=replace(a100.gpu, kernel_module_version="535.104.05"))
    finding = BY_ID["driver.version"].run(mismatched, load_profile("inference-latency"))
    assert finding.status is Status.PENDING_REBOOT  # library is the pin; module is old
    assert "version mismatch" in finding.detail


def test_driver_compat_full_support(a100):
    newer = replace(a100, gpu=replace(a100.gpu, kernel_module_version="550.54.14"))
    assert BY_ID["cuda.driver_compat"].run(newer, load_profile("inference-latency")).status is Status.OK
    old = replace(a100, gpu=replace(a100.gpu, kernel_module_version="470.57.02"))
    f = BY_ID["cuda.driver_compat"].run(old, load_profile("inference-latency"))
    assert f.status is Status.DRIFT and "too old" in f.detail


def test_broken_check_reports_error_not_crash(a100):
    broken = replace(a100, cpu=replace(a100.cpu, governors={0: None, 1: 3}))
    assert BY_ID["cpu.governor"].run(broken, load_profile("inference-latency")).status is Status.ERROR


def test_unknown_check():
    with pytest.raises(HosttuneError, match="known checks"):
        get_check("gpu.nope")


def test_gpu_affinity_names_cpus_that_served_gpu_interrupts(h200, fixture_text):
    from hosttune.probes.pci import parse_interrupts

    counts = {irq: tuple(v["counts"]) for irq, v in parse_interrupts(fixture_text("h200", "proc-interrupts-nvidia.txt")).items()}
    later = {irq: (n[0] + 3, *n[1:]) if irq == 44 else n for irq, n in counts.items()}  # IRQ 44 fired on CPU0 meanwhile
    profile = profile_for(Host("h", "g", ConnectionSpec("h"), irq_cores="4-7"))
    finding = BY_ID["irq.gpu_affinity"].run(replace(h200, gpu_interrupts=counts, gpu_interrupts_later=later), profile)
    assert finding.status is Status.DRIFT
    assert "GPU interrupts served on CPUs 0 while the probe ran" in finding.detail


def test_gpu_affinity_is_not_held_in_drift_by_interrupts_counted_before_the_pinning(h200, fixture_text):
    """/proc/interrupts counts since boot: IRQ 44's 12 on CPU0 from before apply pinned it stay until a reboot."""
    from hosttune.probes.pci import parse_interrupts

    counts = {irq: tuple(v["counts"]) for irq, v in parse_interrupts(fixture_text("h200", "proc-interrupts-nvidia.txt")).items()}
    assert counts[44][0] == 12
    for later in ({}, counts):  # one read only, or nothing new on CPU0 between the two
        facts = replace(h200, gpu_interrupts=counts, gpu_interrupts_later=later)
        finding = BY_ID["irq.gpu_affinity"].run(facts, profile_for(Host("h", "g", ConnectionSpec("h"), irq_cores="4-7")))
        assert "served on CPUs" not in finding.detail


def _with_boot_unit(facts, unit, script: bytes):
    """The unit enabled, its script in /usr/local/sbin holding `script`, as the probe reports it."""
    import hashlib

    from hosttune.probes.facts import ServiceState

    state = ServiceState(unit, "inactive", "enabled", False, hashlib.sha256(script).hexdigest())
    return replace(facts, services={**facts.services, unit: state})


def test_the_governor_boot_unit_is_configured_only_while_its_script_sets_the_governor_wanted_now(a100):
    from hosttune.actions import cpu
    from hosttune.checks.boot_scripts import governor_script

    profile = load_profile("inference-latency")
    facts = replace(a100, cpu=replace(a100.cpu, governors=dict.fromkeys(a100.cpu.governors, "performance")))
    (step,) = cpu.governor(a100, profile, host())
    written = next(op.content for op in step.ops if getattr(op, "path", "") == "/usr/local/sbin/hosttune-cpu-governor")
    assert written == governor_script("performance")  # the check compares what apply writes
    ok = BY_ID["cpu.governor"].run(_with_boot_unit(facts, "hosttune-cpu-governor", written), profile)
    assert (ok.status, ok.configured) == (Status.OK, "performance")
    old = _with_boot_unit(facts, "hosttune-cpu-governor", governor_script("powersave"))  # the profile said powersave
    drift = BY_ID["cpu.governor"].run(old, profile)
    assert (drift.status, drift.configured, drift.active) == (Status.DRIFT, "boot script differs", "performance")
    assert "/usr/local/sbin/hosttune-cpu-governor is not what apply would write for performance" in drift.detail


def test_the_irq_boot_unit_is_configured_only_while_its_script_pins_the_cores_wanted_now(h200):
    from hosttune.actions import irq
    from hosttune.checks.boot_scripts import irq_affinity_script

    h200 = replace(h200, pid1="systemd")  # the recorded VM's PID 1 is not systemd: no boot unit there
    profile = profile_for(Host("h", "g", ConnectionSpec("h"), irq_cores="0-15"))  # where the recorded IRQs are
    (step,) = irq.gpu_affinity(h200, profile, Host("h", "g", ConnectionSpec("h"), irq_cores="0-15"))
    written = next(op.content for op in step.ops if getattr(op, "path", "") == "/usr/local/sbin/hosttune-irq-affinity")
    ok = BY_ID["irq.gpu_affinity"].run(_with_boot_unit(h200, "hosttune-irq-affinity", written), profile)
    assert (ok.status, ok.configured) == (Status.OK, "persisted")
    pins = [(d.bdf, "4-7") for d in h200.pci if d.irqs]  # written while the inventory said irq_cores: 4-7
    old = _with_boot_unit(h200, "hosttune-irq-affinity", irq_affinity_script(pins))
    drift = BY_ID["irq.gpu_affinity"].run(old, profile)
    assert (drift.status, drift.configured) == (Status.DRIFT, "boot script differs")
    assert "/usr/local/sbin/hosttune-irq-affinity is not what apply would write for these cores" in drift.detail


# -- C-states on a paravirtual guest and on bare metal, from recorded probe outputs -------------


def test_haltpoll_guest_c_states_are_not_applicable_with_the_driver_named(haltpoll_guest):
    """Whatever its command line says (none, configured, booted), a haltpoll guest has no deep state to cap."""
    for name, facts in haltpoll_guest.items():
        assert facts.cpu.idle_driver == "haltpoll", name
        found = {f.check_id: f for f in run_checks(facts, load_profile("inference-latency"))}
        cstates = found["cpu.cstates"]
        assert cstates.status is Status.NOT_APPLICABLE and not cstates.is_failing, name
        assert cstates.desired == "max_cstate=1" and "\n" not in cstates.detail
        assert cstates.detail.startswith("cpuidle driver haltpoll: a paravirtual guest whose idle states (POLL, haltpoll idle)")
        assert "hypervisor" in cstates.detail
        assert found["kernel.rcu_nocbs"].status is Status.DRIFT, name  # the rest of the command line is still judged


def test_a_guest_driver_with_a_deep_state_enabled_is_judged_as_before(haltpoll_guest):
    facts = haltpoll_guest["after-reboot"]
    deep = replace(facts, cpu=replace(facts.cpu, idle_states=facts.cpu.idle_states + (("C6", False, 133),)))
    finding = BY_ID["cpu.cstates"].run(deep, load_profile("inference-latency"))
    assert finding.status is Status.DRIFT and "deep idle states enabled now: C6" in finding.detail


@pytest.mark.parametrize("name, status", [("a100", Status.OK), ("h100", Status.OK), ("l40s", Status.PENDING_REBOOT)])
def test_bare_metal_intel_idle_c_states_are_judged_on_the_command_line(request, name, status):
    facts = request.getfixturevalue(name)
    assert facts.cpu.idle_driver == "intel_idle"
    finding = BY_ID["cpu.cstates"].run(facts, load_profile("inference-latency"))
    assert finding.status is status and finding.desired == "intel_idle.max_cstate=1 processor.max_cstate=1"
    assert finding.active == ("intel_idle.max_cstate=- processor.max_cstate=-" if name == "l40s"
                              else "intel_idle.max_cstate=1 processor.max_cstate=1")
    assert ("deep idle states enabled now: C6" in finding.detail) == (name == "l40s")


def test_acpi_idle_is_judged_like_intel_idle(haltpoll_guest):
    facts = haltpoll_guest["before"]
    acpi = replace(facts, cpu=replace(facts.cpu, idle_driver="acpi_idle"))
    assert BY_ID["cpu.cstates"].run(acpi, load_profile("inference-latency")).status is Status.DRIFT


@pytest.mark.parametrize("pid1, init", [("", "missing"), ("sysvinit", "sysvinit")])
def test_an_image_without_systemd_is_described_alike_by_the_governor_check_and_the_boot_units(pid1, init):
    from hosttune.actions import steps_for

    latency = load_profile("inference-latency")
    image = replace(Facts(), image="/img", pid1=pid1)
    governor = get_check("cpu.governor").run(image, latency)
    assert governor.status is Status.NOT_APPLICABLE
    assert governor.detail == f"the image's /sbin/init is {init}, not systemd: set the governor at boot another way"
    findings = run_checks(image, latency)
    notes = [n for s in steps_for(findings, image, latency, host(), (Status.DRIFT, Status.PENDING_REBOOT, Status.OK))
             for n in (*s.notes, s.blocked or "") if "/sbin/init" in n]
    assert notes and all(f"the image's /sbin/init is {init}, not systemd" in n for n in notes)


def test_a_driver_pin_of_a_branch_is_met_by_its_releases(a100):
    """pins: {driver: 535} pins the 535 branch: 535.129.03 is in it, 550.54.15 is not (where 535 drifted forever)."""
    from dataclasses import replace

    profile = load_profile("inference-latency")
    branch = replace(profile, driver=replace(profile.driver, version="535"))
    assert BY_ID["driver.version"].run(a100, branch).status is Status.OK
    newer = replace(profile, driver=replace(profile.driver, version="550"))
    assert BY_ID["driver.version"].run(a100, newer).status is Status.DRIFT
    assert BY_ID["driver.version"].run(a100, replace(profile, driver=replace(profile.driver, version="53"))).status \
        is Status.DRIFT
