"""Parsers on outputs recorded on a real H200 host (tests/fixtures/h200)."""

from hosttune.probes import gpu, pci, software, system
from hosttune.probes.gather import parse_probe_output


def test_nvidia_smi_xml(fixture_text):
    info, gpus = gpu.parse_smi_xml(fixture_text("h200", "nvidia-smi-q.xml"))
    assert info == {"driver_version": "580.159.04", "cuda_driver_version": "13.0"}
    (g,) = gpus
    assert (g.name, g.bdf, g.pstate, g.persistence) == ("NVIDIA H200", "0000:00:06.0", "P0", True)
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    assert (g.ecc_enabled, g.ecc_pending, g.retirement_pending) == (True, False, False)
    assert (g.mig_enabled, g.mig_pending) == (False, False)
    assert g.clock_event_reasons == ("gpu_idle",)
    assert (g.power_limit_w, g.power_limit_max_w, g.sm_clock_max_mhz) == (700.0, 700.0, 1980)
    assert g.memory_total_mib == 143771


def test_nvidia_smi_csv(fixture_text):
    info, (g,) = gpu.parse_smi_csv(fixture_text("h200", "nvidia-smi-query.csv"))
    assert info["driver_version"] == "580.159.04"
    assert (g.index, g.compute_cap, g.pstate, g.persistence) == (0, "9.0", "P0", True)
    assert (g.sm_clock_mhz, g.power_draw_w) == (1980, 123.97)


def test_kernel_module_version(fixture_text):
    assert gpu.parse_module_version(fixture_text("h200", "proc-driver-nvidia-version.txt")) == "580.159.04"


def test_nvcc_version(fixture_text):
    assert software.nvcc_release(fixture_text("h200", "nvcc-version.txt")) == "13.0"


def test_gpu_sysfs_numa_minus_one_is_no_numa_info(fixture_text):
    dev = pci.parse_recorded_sysfs(fixture_text("h200", "gpu-pci-sysfs.txt"), "0000:00:06.0")
    assert dev.numa_node is None
    assert dev.local_cpus == tuple(range(16))
    assert dev.power_state == "D0"
    assert [i.irq for i in dev.irqs] == list(range(42, 50))
    assert all(i.cpus == tuple(range(16)) for i in dev.irqs)


def test_proc_interrupts(fixture_text):
    irqs = pci.parse_interrupts(fixture_text("h200", "proc-interrupts-nvidia.txt"))
    assert sorted(irqs) == list(range(42, 50))
    assert irqs[44]["counts"][0] == 12 and len(irqs[44]["counts"]) == 16
    assert "PCI-MSIX-0000:00:06.0" in irqs[42]["name"]


def test_numa_thp_balancing(fixture_text):
    assert system.parse_numactl_hardware(fixture_text("h200", "numactl-hardware.txt")) == {0: tuple(range(16))}
    assert system.selected(fixture_text("h200", "thp-enabled.txt")) == "madvise"
    assert fixture_text("h200", "numa_balancing.txt").strip() == "0"


def test_whole_probe_output_recorded_on_h200(fixture_text):
    """The probe script's own output, recorded on the H200 (NVML absent there, so nvidia-smi XML)."""
    f = parse_probe_output(fixture_text("h200", "probe-output.txt"))
    assert [e.split(":")[0] for e in f.probe_errors] == ["monitor", "health-host", "kernel-log", "pci-health"]  # an older probe's output
    assert f.gpu.source == "nvidia-smi-xml"
    assert (f.gpu.driver_version, f.gpu.kernel_module_version, f.gpu.cuda_driver_version) == ("580.159.04",) * 2 + ("13.0",)
    (g,) = f.gpu.gpus
    assert g.name == "NVIDIA H200" and g.persistence is True and g.pstate == "P0"
    (dev,) = f.pci
    assert dev.bdf == g.bdf == "0000:00:06.0"
    assert dev.numa_node is None and dev.local_cpus == tuple(range(16)) and dev.link_width == 16
    assert [i.irq for i in dev.irqs] == list(range(42, 50))
    assert f.cuda.symlink_version == "13.0" and f.cuda.nvcc_version is None  # nvcc is not on the login PATH there
    assert f.numa_balancing == 0 and f.thp_enabled == "madvise" and f.pid1 != "systemd"
    assert f.python_version.startswith("3.12")


def test_whole_probe_output_through_nvml_on_h200(fixture_text):
    """The same host probed again once the probe tried the caller's python3 (which has pynvml)."""
    f = parse_probe_output(fixture_text("h200", "probe-output-nvml.txt"))
    assert [e.split(":")[0] for e in f.probe_errors] == ["monitor", "health-host", "kernel-log", "pci-health"] and f.gpu.source == "nvml"
    (g,) = f.gpu.gpus
    assert (g.name, g.bdf, g.compute_cap, g.pstate, g.persistence) == ("NVIDIA H200", "0000:00:06.0", "9.0", "P0", True)
    assert (g.power_limit_max_w, g.ecc_enabled, g.mig_enabled) == (700.0, True, False)
    assert f.gpu.driver_version == f.gpu.kernel_module_version == "580.159.04"
    assert f.gpu.cuda_driver_version == "13.0"
    assert [i.irq for i in f.pci[0].irqs] == list(range(42, 50)) and f.pci[0].numa_node is None


def test_gpu_output_of_another_tool_version_is_a_probe_error_not_a_crash(fixture_text):
    """nvidia-smi XML whose bus id is not one (another driver's wording), or NVML JSON with a field this hosttune
    does not know: the source fails like one that could not run, and the next is tried."""
    from hosttune.probes.sections import split

    recorded = fixture_text("h200", "probe-output.txt")
    xml = split(recorded)["smi-xml"].text
    odd_bus = recorded.replace(xml, xml.replace("<pci_bus_id>00000000:00:06.0</pci_bus_id>",
                                                "<pci_bus_id>GPU 0000:00:06.0</pci_bus_id>"))
    assert odd_bus != recorded
    f = parse_probe_output(odd_bus)
    assert f.gpu.gpus == () and "smi-xml" in f.gpu.error and any(e.startswith("gpu: ") for e in f.probe_errors)
    assert "smi-xml: PCI bus id 'GPU 0000:00:06.0' is not DOMAIN:BUS:DEVICE.FUNCTION" in f.probe_errors
    newer = recorded.replace("@@ht:nvml\n\n@@ht-end:nvml:3", '@@ht:nvml\n{"driver_version": "999.1", "gpus": [{"index": 0, '
                             '"name": "NVIDIA Z100", "bdf": "00000000:00:06.0", "fan_speed_pct": 30}]}\n@@ht-end:nvml:0')
    assert newer != recorded
    assert parse_probe_output(newer).gpu.source == "nvidia-smi-xml"  # NVML's JSON failed: the XML was read
