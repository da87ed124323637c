"""Health checks as data: recorded H200 facts are healthy; documented faults fail the right check."""

from dataclasses import replace

import pytest

from hosttune.checks import BY_ID, get_check
from hosttune.probes.facts_health import (ActiveRun, AerCounts, AllReduce, BridgeAcs, CudaRun, CudaSmoke, FabricManager,
                                   KernelLog, LoadSample, NvLink, ShmFacts, XidEvent)
from hosttune.checks.findings import Severity, Status
from hosttune.probes import gpu_health, kernel_log
from hosttune.probes.health import with_health
from hosttune.probes.sections import Section
from hosttune.config.profile import load_profile

PROFILE = load_profile("inference-latency")
NEW = ("gpu.xid", "gpu.count", "cuda.smoke", "gpu.memory_health", "gpu.nvlink", "gpu.fabric", "pci.p2p",
       "pci.aer", "gpu.clocks_power", "sys.shm", "gpu.load", "gpu.diag", "gpu.allreduce")


def run(check_id, facts, profile=PROFILE):
    return get_check(check_id).run(facts, profile)


def health(facts, **fields):
    return replace(facts, health=replace(facts.health, **fields))


@pytest.fixture
def h200_ok(h200):
    """The recorded H200 plus what a healthy probe of it adds: uvm, nodes, a passing smoke test (and the sections
    its older probe did not print, read)."""
    return health(replace(h200, unread=()), uvm_loaded=True, device_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"),
                  cuda=CudaRun("libcuda", None, (CudaSmoke(0, "0000:00:06.0", True, ms=380.0),)),
                  kernel_log=KernelLog("dmesg"), shm=ShmFacts(64 << 20, 0, "tmpfs"), hypervisor=True)


def test_every_new_check_has_an_explain_text():
    for check_id in NEW:
        c = BY_ID[check_id]
        assert c.why.endswith(".") and len(c.why) > 60 and c.remediation


def test_recorded_h200_is_healthy(h200_ok):
    statuses = {i: run(i, h200_ok).status for i in NEW}
    assert statuses == {
        "gpu.xid": Status.OK, "gpu.count": Status.OK, "cuda.smoke": Status.OK, "gpu.memory_health": Status.OK,
        "gpu.nvlink": Status.NOT_APPLICABLE, "gpu.fabric": Status.NOT_APPLICABLE, "pci.p2p": Status.NOT_APPLICABLE,
        "pci.aer": Status.NOT_APPLICABLE, "gpu.clocks_power": Status.OK, "sys.shm": Status.OK,
        "gpu.load": Status.NOT_APPLICABLE, "gpu.diag": Status.NOT_APPLICABLE, "gpu.allreduce": Status.NOT_APPLICABLE,
    }
    assert "Pass-Through" not in run("pci.p2p", h200_ok).detail and "virtual machine" in run("pci.p2p", h200_ok).detail


def test_without_gpu_every_gpu_check_is_not_applicable():
    from hosttune.probes.facts import Facts
    facts = Facts(health=replace(Facts().health, shm=ShmFacts(1 << 22, 0, "tmpfs"), kernel_log=KernelLog("dmesg")))
    for check_id in set(NEW) - {"sys.shm"}:
        assert run(check_id, facts).status is Status.NOT_APPLICABLE, check_id


def test_fatal_xid_is_critical_others_are_warnings(h200_ok, fixture_text):
    lines = fixture_text("gpu-health", "dmesg-xid.txt").splitlines()
    events = tuple(e for line in lines if (e := kernel_log.parse_xid_line(line)))
    fatal = run("gpu.xid", health(h200_ok, kernel_log=KernelLog("dmesg", events, len(events))))
    assert fatal.status is Status.DRIFT and fatal.severity is Severity.CRITICAL
    assert fatal.detail.startswith("PCI 0000:3b:00 Xid 79: GPU has fallen off the bus")
    assert "GPU0 Xid 13 x2: graphics engine exception" in fatal.detail
    app_only = run("gpu.xid", health(h200_ok, kernel_log=KernelLog("dmesg", events[:3], 3)))
    assert app_only.status is Status.DRIFT and app_only.severity is Severity.WARNING


def test_xid_in_the_log_counts_even_when_the_gpu_is_gone():
    from hosttune.probes.facts import Facts
    event = XidEvent("0000:3b:00", 79, "GPU has fallen off the bus.")
    f = run("gpu.xid", Facts(health=replace(Facts().health, kernel_log=KernelLog("dmesg", (event,), 1))))
    assert f.status is Status.DRIFT and f.severity is Severity.CRITICAL


def test_unreadable_kernel_log_is_an_error(h200_ok):
    assert run("gpu.xid", health(h200_ok, kernel_log=KernelLog())).status is Status.ERROR


def test_gpu_missing_from_nvml_uvm_and_inventory(h200_ok):
    lost = replace(h200_ok, gpu=replace(h200_ok.gpu, pci_devices=("0000:00:06.0", "0000:00:07.0")))
    f = run("gpu.count", lost)
    assert f.status is Status.DRIFT and "driver lost 0000:00:07.0" in f.detail
    assert "nvidia-uvm is not loaded" in run("gpu.count", health(h200_ok, uvm_loaded=False)).detail
    no_node = run("gpu.count", health(h200_ok, device_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm")))
    assert "1 of the /dev/nvidiaN nodes" in no_node.detail
    wants_two = replace(PROFILE, health=replace(PROFILE.health, gpus="0-1", gpu_count=2))
    detail = run("gpu.count", h200_ok, wants_two).detail
    assert "expects 2 GPU(s)" in detail and "selects GPU 1" in detail


def test_cuda_error_802_names_fabric_manager(h200_ok):
    f = run("cuda.smoke", health(h200_ok, cuda=CudaRun("libcuda", "cuInit: CUDA_ERROR_SYSTEM_NOT_READY (802)")))
    assert f.status is Status.DRIFT and "gpu.fabric" in f.detail
    one_bad = CudaRun("libcuda", None, (CudaSmoke(0, "0000:00:06.0", False, "kernel: CUDA_ERROR_ILLEGAL_ADDRESS (700)"),))
    assert run("cuda.smoke", health(h200_ok, cuda=one_bad)).status is Status.DRIFT


def test_gpu_held_by_an_engine_is_not_a_smoke_failure(h200_ok):
    held = CudaRun("libcuda", None, (CudaSmoke(0, "0000:00:06.0", False, "cuDevicePrimaryCtxRetain: CUDA_ERROR_DEVICES_UNAVAILABLE (46)"),))
    f = run("cuda.smoke", health(h200_ok, cuda=held))
    assert f.status is Status.OK and "held by another process" in f.detail and f.active.startswith("0 of 1")


def test_no_cuda_runtime_is_not_applicable_with_the_reason(h200_ok):
    f = run("cuda.smoke", health(h200_ok, cuda=CudaRun(None, "libcuda.so.1 not found")))
    assert f.status is Status.NOT_APPLICABLE and "libcuda.so.1 not found" in f.detail


def test_faulty_memory_and_clocks(h200_ok, fixture_text):
    faulty = health(h200_ok, gpus=gpu_health.parse_health_xml(fixture_text("gpu-health", "nvidia-smi-q-faulty.xml")))
    mem = run("gpu.memory_health", faulty)
    assert mem.status is Status.DRIFT
    for text in ("row remapping failed", "1 memory bank(s) with no spare rows", "2 uncorrectable DRAM", "recovery action Reset"):
        assert text in mem.detail
    clocks = run("gpu.clocks_power", faulty)
    assert clocks.status is Status.DRIFT
    for text in ("applications clocks 1410 MHz", "power limit 500 W, below the default 700 W", "3 C from thermal slowdown"):
        assert text in clocks.detail


def test_pending_remap_alone_is_pending_reboot(h200_ok):
    (g,) = h200_ok.health.gpus
    f = run("gpu.memory_health", health(h200_ok, gpus=(replace(g, remap_pending=True),)))
    assert f.status is Status.PENDING_REBOOT and f.needs_reboot


def test_vbios_mix_on_one_host(h200_ok):
    (g,) = h200_ok.health.gpus
    mixed = (g, replace(g, index=1, bdf="0000:00:07.0", vbios="96.00.74.00.01"))
    assert "VBIOS differ" in run("gpu.clocks_power", health(h200_ok, gpus=mixed)).detail


def _two_gpus(facts):
    (g,) = facts.gpu.gpus
    gpus = (g, replace(g, index=1, bdf="0000:00:07.0"))
    return replace(facts, gpu=replace(facts.gpu, gpus=gpus, pci_devices=tuple(x.bdf for x in gpus)))


def test_nvlink_inactive_and_rising_errors(h200_ok, fixture_text):
    links = gpu_health.parse_nvlink_status(fixture_text("gpu-health", "nvlink-status-8gpu.txt"))
    reads = tuple(gpu_health.parse_nvlink_errors(fixture_text("gpu-health", f"nvlink-errors-{i}.txt")) for i in (1, 2))
    f = run("gpu.nvlink", health(_two_gpus(h200_ok), nvlinks=links, nvlink_errors=reads))
    assert f.status is Status.DRIFT and "GPU1 link 1" in f.detail and "GPU0 link 1 CRC Errors 12 -> 19" in f.detail
    steady = health(_two_gpus(h200_ok), nvlinks=tuple(replace(l, active=True) for l in links), nvlink_errors=reads[:1] * 2)
    assert run("gpu.nvlink", steady).status is Status.OK


def test_single_gpu_with_idle_links_is_not_applicable(h200_ok):
    idle = health(h200_ok, nvlinks=tuple(NvLink(0, i, False) for i in range(18)))
    assert run("gpu.nvlink", idle).status is Status.NOT_APPLICABLE


def test_fabric_manager_down_or_wrong_version(h200_ok):
    nvswitch = health(h200_ok, fabric=FabricManager(nvswitches=4, active="inactive", enabled="disabled", version="580.95.05"))
    nvswitch = replace(nvswitch, pid1="systemd")
    f = run("gpu.fabric", nvswitch)
    assert f.status is Status.DRIFT and "error 802" in f.detail and "differs from driver 580.159.04" in f.detail
    (g,) = h200_ok.health.gpus
    in_progress = health(h200_ok, gpus=(replace(g, fabric_state="In Progress"),))
    assert "fabric In Progress" in run("gpu.fabric", in_progress).detail
    good = health(h200_ok, fabric=FabricManager(4, "active", "enabled", True, "580.159.04"),
                  gpus=(replace(g, fabric_state="Completed", fabric_status="Success"),))
    assert run("gpu.fabric", replace(good, pid1="systemd")).status is Status.OK


def test_p2p_iommu_and_acs_on_bare_metal(h200_ok):
    bare = health(_two_gpus(h200_ok), hypervisor=False, iommu_types={"0000:00:06.0": "DMA-FQ", "0000:00:07.0": "DMA-FQ"},
                  bridges=(BridgeAcs("0000:05:00.0", "0000:00:06.0", 0x1D),))
    f = run("pci.p2p", bare)
    assert f.status is Status.DRIFT and "translates DMA" in f.detail and "ACS redirect on switch port 0000:05:00.0" in f.detail
    fixed = health(bare, iommu_types={"0000:00:06.0": "identity"}, bridges=(BridgeAcs("0000:05:00.0", "0000:00:06.0", 0x01),))
    assert run("pci.p2p", fixed).status is Status.OK
    pending = replace(health(bare, bridges=()), cmdline_configured=("quiet", "iommu=pt"))
    assert run("pci.p2p", pending).status is Status.PENDING_REBOOT


def test_aer_fatal_is_critical_correctable_a_warning(h200_ok):
    fatal = AerCounts("0000:5e:00.0", "nic", correctable=6, fatal=1, nonzero=(("fatal CmpltTO", 1),))
    f = run("pci.aer", health(h200_ok, aer=(fatal,)))
    assert f.status is Status.DRIFT and f.severity is Severity.CRITICAL and "CmpltTO 1" in f.detail
    noisy = run("pci.aer", health(h200_ok, aer=(AerCounts("0000:00:06.0", "gpu", correctable=3),)))
    assert noisy.status is Status.DRIFT and noisy.severity is Severity.WARNING
    assert run("pci.aer", health(h200_ok, aer=(AerCounts("0000:00:06.0", "gpu"),))).status is Status.OK


def test_shm_of_a_default_container_is_too_small(h200_ok):
    f = run("sys.shm", health(h200_ok, shm=ShmFacts(65536, 0, "tmpfs")))
    assert f.status is Status.DRIFT and "64 MiB" in f.detail
    assert run("sys.shm", health(h200_ok, shm=ShmFacts())).status is Status.DRIFT


def _loaded(facts, samples, **more):
    """Facts as the probe leaves them after an active load (GPU fields judged under that load)."""
    return with_health(health(facts, active=ActiveRun(6.0, None, tuple(samples), **more)), {}, [])


def sample(**kw):
    base = dict(gpu=0, pstate="P0", sm_mhz=1980, sm_max_mhz=1980, util_pct=100, power_w=420.0, reasons=())
    return LoadSample(**{**base, **kw})


def test_active_load_judges_pstate_and_clocks_under_load(h200_ok):
    good = _loaded(h200_ok, [sample(), sample(sm_mhz=1965)])
    assert run("gpu.load", good).status is Status.OK
    assert run("gpu.pstate", good).status is Status.OK and "1965/1980 MHz" in run("gpu.pstate", good).active
    hot = _loaded(h200_ok, [sample(sm_mhz=1200, reasons=("hw_thermal_slowdown",))])
    assert run("gpu.load", hot).status is Status.DRIFT and "hw_thermal_slowdown" in run("gpu.load", hot).detail
    assert run("gpu.pstate", hot).status is Status.DRIFT  # the idle reading would have passed
    locked = _loaded(h200_ok, [sample(sm_mhz=1410, reasons=("applications_clocks_setting",))])
    assert "locked at 1410 of 1980 MHz" in run("gpu.load", locked).detail
    capped = _loaded(h200_ok, [sample(sm_mhz=1700, reasons=("sw_power_cap",), power_w=699.0)])
    assert run("gpu.load", capped).status is Status.OK  # dense math at the full power limit


def test_active_load_that_never_loads_the_gpu(h200_ok):
    idle = _loaded(h200_ok, [sample(util_pct=0, pstate="P8", sm_mhz=345)])
    assert "never above 30%" in run("gpu.load", idle).detail
    failed = health(h200_ok, active=ActiveRun(load_error="GPU0: cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED (719)"))
    assert run("gpu.load", failed).status is Status.DRIFT


def test_dcgm_diag_and_allreduce_floor(h200_ok):
    failing = health(h200_ok, active=ActiveRun(diag="fail", diag_detail="Persistence Mode"))
    assert run("gpu.diag", failing).status is Status.DRIFT
    assert run("gpu.diag", health(h200_ok, active=ActiveRun())).status is Status.NOT_APPLICABLE  # no DCGM
    no_engine = health(h200_ok, active=ActiveRun(diag="unavailable", diag_detail="Error: unable to connect"))
    assert "host engine does not answer" in run("gpu.diag", no_engine).detail
    two = _two_gpus(h200_ok)
    nvlinked = health(two, nvlinks=(NvLink(0, 0, True), NvLink(1, 0, True)))
    slow = health(nvlinked, active=ActiveRun(allreduce=AllReduce(2, 256 << 20, 95.0)))
    f = run("gpu.allreduce", slow)
    assert f.status is Status.DRIFT and "NVIDIA H200 over NVLink" in f.desired
    fast = health(nvlinked, active=ActiveRun(allreduce=AllReduce(2, 256 << 20, 340.0)))
    assert run("gpu.allreduce", fast).status is Status.OK
    pcie = health(two, active=ActiveRun(allreduce=AllReduce(2, 256 << 20, 24.0)))
    assert run("gpu.allreduce", pcie).status is Status.OK and "PCIe Gen5" in run("gpu.allreduce", pcie).desired
    hung = health(two, active=ActiveRun(allreduce_error="the all-reduce did not finish within 120 s"))
    assert run("gpu.allreduce", hung).status is Status.DRIFT


def test_health_section_failures_are_probe_errors(h200):
    errors = []
    with_health(h200, {"cuda-smoke": Section("cuda-smoke", "Segmentation fault", 139)}, errors)
    assert errors and errors[0].startswith("cuda-smoke:")


def test_p2p_unreadable_config_space_is_an_error(h200_ok):
    bare = health(_two_gpus(h200_ok), hypervisor=False, bridges=(BridgeAcs("0000:05:00.0", "0000:00:06.0", None, readable=False),))
    f = run("pci.p2p", bare)
    assert f.status is Status.ERROR and "run as root" in f.detail


def test_a_probe_output_without_its_health_sections_is_not_read_not_a_fault(fixture_text):
    """The recorded outputs were written by a probe that had no health-host, kernel-log, pci-health or monitor
    section yet: the parts they read are unknown on such a host, not missing from it (no /dev/shm, no nvidia-uvm)."""
    from hosttune.probes.gather import parse_probe_output

    f = parse_probe_output(fixture_text("h200", "probe-output.txt"))
    assert [e.split(":")[0] for e in f.probe_errors] == ["monitor", "health-host", "kernel-log", "pci-health"]
    assert "not in the probe's output" in f.probe_errors[0]
    shm, count = run("sys.shm", f), run("gpu.count", f)
    assert shm.status is Status.ERROR and "did not read /dev/shm" in shm.detail
    assert count.status is Status.ERROR and "nvidia-uvm and the device nodes were not read" in count.detail
    assert "nvidia-uvm is not loaded" not in count.detail and "missing" not in count.detail
    lost = replace(f, gpu=replace(f.gpu, pci_devices=(*f.gpu.pci_devices, "0000:00:07.0")))
    assert run("gpu.count", lost).status is Status.DRIFT  # what was read fails on its own


def test_a_probe_that_found_no_shm_is_still_a_missing_shm(h200_ok):
    from hosttune.probes.host_health import parse_health_host

    assert run("sys.shm", health(h200_ok, **parse_health_host("shm:\n"))).status is Status.DRIFT


# nvidia-smi -q -x of another driver generation, as hosttune's parsers read it: a GPU, and none of the fields the
# checks judge (no P-state, persistence, link, power or clocks elements)
BARE_XML = """<?xml version="1.0" ?>
<nvidia_smi_log><driver_version>999.1</driver_version><cuda_version>14.0</cuda_version>
<gpu id="00000000:00:06.0"><product_name>NVIDIA Z100</product_name>
<uuid>GPU-4b794de7-279f-721d-5fe5-8f6fcbfb3cf4</uuid><pci><pci_bus_id>00000000:00:06.0</pci_bus_id></pci></gpu>
</nvidia_smi_log>"""


@pytest.mark.parametrize("check_id, what", [
    ("gpu.pstate", "no P-state read for GPU0"),
    ("gpu.persistence", "no persistence mode read for GPU0"),
    ("gpu.pcie_link", "no PCIe link read for GPU0"),
    ("gpu.clocks_power", "no power limit, clocks or temperature read for GPU0"),
])
def test_a_gpu_whose_fields_nvidia_smi_did_not_give_cannot_be_judged_not_ok(h200_ok, check_id, what):
    from hosttune.probes.gpu import parse_smi_xml

    _, gpus = parse_smi_xml(BARE_XML)
    bare = health(replace(h200_ok, gpu=replace(h200_ok.gpu, gpus=gpus)), gpus=gpu_health.parse_health_xml(BARE_XML))
    f = run(check_id, bare)
    assert f.status is Status.ERROR and what in f.detail, (f.status, f.detail)
    assert run(check_id, h200_ok).status is not Status.ERROR  # the recorded H200 gave them


def test_a_kernel_log_the_probe_did_not_read_is_not_blamed_on_root(fixture_text):
    """The recorded outputs have no kernel-log section: running as root would not change that."""
    from hosttune.probes.gather import parse_probe_output

    f = run("gpu.xid", parse_probe_output(fixture_text("h200", "probe-output.txt")))
    assert f.status is Status.ERROR and f.detail == "the probe's output has no kernel-log section: no Xid can be seen"
    denied = kernel_log.parse_kernel_log("", 1)  # neither dmesg nor journalctl -k could be read
    assert "run as root" in run("gpu.xid", health(parse_probe_output(fixture_text("h200", "probe-output.txt")),
                                                  kernel_log=denied)).detail


@pytest.mark.parametrize("section, check_id", [("services", "irq.irqbalance"), ("tools", "tools.numactl"),
                                                ("cuda", "cuda.toolkit"), ("sysctl", "numa.topology")])
def test_a_check_whose_section_the_probe_output_lacks_cannot_be_judged(fixture_text, section, check_id):
    """Without its section a check would judge defaults (no irqbalance, no numactl, nothing held) as the host."""
    import re

    from hosttune.probes.gather import parse_probe_output

    recorded = fixture_text("h200", "probe-output.txt")
    cut = re.sub(rf"^@@ht:{section}\n.*?^@@ht-end:{section}:\d+\n", "", recorded, count=1, flags=re.S | re.M)
    assert cut != recorded
    facts = parse_probe_output(cut)
    assert section in facts.unread and run(check_id, parse_probe_output(recorded)).status is not Status.ERROR
    f = run(check_id, facts)
    assert f.status is Status.ERROR and f.detail == (f"the probe's output has no {section} section: what this check "
                                                     "reads there is unknown")


# The same GPU where its driver reads the modes and counters and says the GPU has none (a GPU without ECC or MIG)
NA_XML = BARE_XML.replace("</pci></gpu>", "</pci><mig_mode><current_mig>N/A</current_mig><pending_mig>N/A</pending_mig>"
                          "</mig_mode><ecc_mode><current_ecc>N/A</current_ecc><pending_ecc>N/A</pending_ecc></ecc_mode>"
                          "<ecc_errors><volatile><dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors>"
                          "<retired_pages><pending_retirement>N/A</pending_retirement></retired_pages>"
                          "<remapped_rows>N/A</remapped_rows></gpu>")


def _from_xml(facts, xml):
    from hosttune.probes.gpu import parse_smi_xml

    _, gpus = parse_smi_xml(xml)
    return health(replace(facts, gpu=replace(facts.gpu, gpus=gpus)), gpus=gpu_health.parse_health_xml(xml))


@pytest.mark.parametrize("check_id, what", [
    ("gpu.ecc", "no ECC mode read for GPU0"),
    ("gpu.mig", "no MIG mode read for GPU0"),
    ("gpu.memory_health", "no remapped rows, retired pages or ECC error counters read for GPU0"),
])
def test_modes_and_counters_not_read_are_not_a_gpu_without_them(h200_ok, check_id, what):
    f = run(check_id, _from_xml(h200_ok, BARE_XML))
    assert f.status is Status.ERROR and what in f.detail, (f.status, f.detail)
    said_na = run(check_id, _from_xml(h200_ok, NA_XML))
    assert said_na.status is (Status.OK if check_id == "gpu.memory_health" else Status.NOT_APPLICABLE), said_na.detail


NVML_FAKE = '''
class NVMLError(Exception):
    def __init__(self, value):
        self.value = value
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN, NVML_CLOCK_SM = 3, 999, 1
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetEccMode(h): raise NVMLError({ecc})
def nvmlDeviceGetMigMode(h): raise NVMLError({mig})
def __getattr__(name):
    def fail(*args):
        raise NVMLError(NVML_ERROR_UNKNOWN)
    return fail
'''


@pytest.mark.parametrize("ecc, mig, status", [(3, 3, Status.NOT_APPLICABLE), (999, 999, Status.ERROR)])
def test_nvml_tells_a_mode_the_gpu_lacks_from_one_it_failed_to_read(h200_ok, tmp_path, ecc, mig, status):
    import subprocess
    import sys
    from pathlib import Path

    import hosttune.probes
    from hosttune.probes.gpu import parse_nvml_json

    (tmp_path / "pynvml.py").write_text(NVML_FAKE.format(ecc=ecc, mig=mig))
    script = Path(hosttune.probes.__file__).parent / "nvml_probe.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(tmp_path)}).stdout
    _, gpus = parse_nvml_json(out)
    facts = replace(h200_ok, gpu=replace(h200_ok.gpu, gpus=gpus))
    assert run("gpu.ecc", facts).status is status and run("gpu.mig", facts).status is status


@pytest.mark.parametrize("section, check_id", [("packages", "driver.held"), ("gpu-pci", "gpu.count")])
def test_a_host_without_the_thing_is_not_a_probe_output_without_its_section(fixture_text, section, check_id):
    """Without its section a check would say the host has none (no driver packages, no GPU); a check the profile
    does not manage stays not-applicable, on any output."""
    import re

    from hosttune.probes.facts import Facts
    from hosttune.probes.gather import parse_probe_output

    recorded = fixture_text("h200", "probe-output.txt")
    cut = re.sub(rf"^@@ht:{section}\n.*?^@@ht-end:{section}:\d+\n", "", recorded, count=1, flags=re.S | re.M)
    facts = replace(parse_probe_output(cut), packages=(), held=(), gpu=replace(Facts().gpu, pci_devices=()))
    assert section in facts.unread and run(check_id, replace(facts, unread=())).status is Status.NOT_APPLICABLE
    f = run(check_id, facts)
    assert f.status is Status.ERROR and f.detail == (f"the probe's output has no {section} section: what this check "
                                                     "reads there is unknown")
    unmanaged = replace(PROFILE, driver=replace(PROFILE.driver, held=False))
    assert run("driver.held", facts, unmanaged).status is Status.NOT_APPLICABLE
