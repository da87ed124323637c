"""Health probes' parsers on recorded (H200) and documented outputs, ok and failing."""

import json
import subprocess
from pathlib import Path

import pytest

from hosttune.errors import ProbeError
from hosttune.probes import gpu_health, host_health, kernel_log, pci_health

SCRIPT = Path(__file__).resolve().parents[2] / "hosttune" / "probes" / "script.sh"


def test_h200_health_fields_from_recorded_xml(fixture_text):
    (g,) = gpu_health.parse_health_xml(fixture_text("h200", "nvidia-smi-q.xml"))
    assert (g.bdf, g.name, g.vbios, g.virtualization) == ("0000:00:06.0", "NVIDIA H200", "96.00.A5.00.1A", "Pass-Through")
    assert (g.remap_corr, g.remap_unc, g.remap_pending, g.remap_failure, g.remap_banks_none) == (0, 0, False, False, 0)
    assert (g.retired_sbe, g.retired_dbe, g.retired_pending) == (None, None, None)  # N/A on Hopper: rows are remapped
    assert (g.sram_unc_volatile, g.dram_unc_volatile, g.sram_threshold_exceeded) == (0, 0, False)
    assert (g.temp_c, g.slowdown_margin_c, g.power_limit_w, g.power_default_w) == (37, 50, 700.0, 700.0)
    assert (g.app_clock_mhz, g.app_clock_default_mhz, g.recovery_action) == (1980, 1980, "None")
    assert (g.fabric_state, g.fabric_status) == (None, None)  # no NVSwitch fabric in this VM


def test_faulty_gpu_health_fields(fixture_text):
    (g,) = gpu_health.parse_health_xml(fixture_text("gpu-health", "nvidia-smi-q-faulty.xml"))
    assert (g.remap_unc, g.remap_pending, g.remap_failure, g.remap_banks_none) == (3, True, True, 1)
    assert (g.dram_unc_volatile, g.dram_unc_aggregate, g.recovery_action) == (2, 0, "Reset")
    assert (g.power_limit_w, g.app_clock_mhz, g.slowdown_margin_c, g.fabric_state) == (500.0, 1410, 3, "In Progress")


def test_invalid_xml_is_a_probe_error():
    with pytest.raises(ProbeError, match="invalid XML"):
        gpu_health.parse_health_xml("<nvidia_smi_log><gpu>")


def test_xid_lines_new_and_old_format(fixture_text):
    log = kernel_log.parse_kernel_log(
        "source:dmesg\ntotal:7\n" + "".join(f"xid:{line}\n" for line in fixture_text("gpu-health", "dmesg-xid.txt").splitlines()), 0)
    assert log.source == "dmesg" and log.total == 7
    assert [(e.bdf, e.code) for e in log.events] == [
        ("0000:00:06", 13), ("0000:00:06", 13), ("0000:00:06", 31), ("0000:3b:00", 79), ("0000:86:00", 48), ("0000:86:00", 119)]
    assert log.events[3].text == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def test_unreadable_kernel_log_has_no_source():
    assert kernel_log.parse_kernel_log("", 1).source is None
    assert kernel_log.parse_kernel_log("source:journal\ntotal:0\n", 0).events == ()


def test_nvlink_status_and_error_counters(fixture_text):
    links = gpu_health.parse_nvlink_status(fixture_text("gpu-health", "nvlink-status-8gpu.txt"))
    assert len(links) == 8 and [(l.gpu, l.link) for l in links if not l.active] == [(1, 1)]
    assert links[0].speed_gbps == 26.562
    first = gpu_health.parse_nvlink_errors(fixture_text("gpu-health", "nvlink-errors-1.txt"))
    assert first["GPU0 link 1 CRC Errors"] == 12 and len(first) == 9


def test_no_nvlink_output_gives_no_links():
    assert gpu_health.parse_nvlink_status("") == ()


def _aer_lines(bdf, directory: Path) -> str:
    return "".join(f"aer:{bdf}:{f.name}:{line}\n" for f in sorted(directory.iterdir()) for line in f.read_text().splitlines())


def test_aer_iommu_and_acs_lines(fixture_text):
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-health" / "aer-sysfs"
    text = ("dev:0000:3b:00.0:gpu\ndev:0000:5e:00.0:nic\ndev:0000:07:00.0:nvswitch\n"
            + _aer_lines("0000:5e:00.0", fixtures)
            + "iommu:0000:3b:00.0:DMA-FQ\nacs:0000:3a:00.0:0000:3b:00.0:29\nacs:0000:39:00.0:0000:3b:00.0:unreadable\n")
    aer, iommu, bridges, switches = pci_health.parse_pci_health(text)
    (nic,) = aer  # only the NIC has AER files here
    assert (nic.kind, nic.correctable, nic.nonfatal, nic.fatal) == ("nic", 6, 0, 1)
    assert ("fatal CmpltTO", 1) in nic.nonzero and ("correctable BadTLP", 4) in nic.nonzero
    assert iommu == {"0000:3b:00.0": "DMA-FQ"} and switches == 1
    assert [(b.bdf, b.acs_ctl, b.readable) for b in bridges] == [("0000:3a:00.0", 29, True), ("0000:39:00.0", None, False)]


def _config_with_acs(ctl: int) -> bytes:
    """A PCIe config space: AER at 0x100 → ACS at 0x148 with this control word (PCIe spec 7.7.8)."""
    cfg = bytearray(4096)
    cfg[0x100:0x104] = (0x0001 | 1 << 16 | 0x148 << 20).to_bytes(4, "little")
    cfg[0x148:0x14C] = (0x000D | 1 << 16 | 0 << 20).to_bytes(4, "little")
    cfg[0x14E:0x150] = ctl.to_bytes(2, "little")
    return bytes(cfg)


def _acs_ctl(device: Path) -> str:
    lines = SCRIPT.read_text().splitlines()
    start = lines.index("acs_ctl() {  # $1: a bridge's sysfs dir. Walks the extended capabilities to ACS (id 0x0d).")
    body = "\n".join(lines[start:lines.index("}", start) + 1])
    return subprocess.run(["sh", "-c", body + '\nacs_ctl "$1"', "sh", str(device)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("ctl", [0x1D, 0x00])
def test_probe_walks_extended_capabilities_to_acs(tmp_path, ctl):
    (tmp_path / "config").write_bytes(_config_with_acs(ctl))
    assert _acs_ctl(tmp_path) == str(ctl)


def test_probe_reports_no_acs_on_conventional_pci(tmp_path):
    (tmp_path / "config").write_bytes(bytes(256))
    assert _acs_ctl(tmp_path) == "none"


def test_shm_df_and_mounts():
    s = host_health.parse_shm("shm 65536 12 65524 1% /dev/shm", "shm /dev/shm tmpfs rw,nosuid,nodev,size=65536k 0 0")
    assert (s.size_kib, s.used_kib, s.fstype) == (65536, 12, "tmpfs")
    assert host_health.parse_shm("", "").size_kib is None


def test_cuda_smoke_json_ok_and_802():
    ok = host_health.parse_cuda_smoke(json.dumps({"runtime": "libcuda", "error": None, "gpus": [
        {"index": 0, "bdf": "00000000:00:06.0", "ok": True, "ms": 412.5}]}), 0)
    assert ok.gpus[0].bdf == "0000:00:06.0" and ok.gpus[0].ok
    bad = host_health.parse_cuda_smoke(json.dumps({"runtime": "libcuda", "error": "cuInit: CUDA_ERROR_SYSTEM_NOT_READY (802)", "gpus": []}), 0)
    assert "802" in bad.error
    assert host_health.parse_cuda_smoke("", 127).runtime is None
    assert "timeout" in host_health.parse_cuda_smoke("", 124).error


def test_active_load_json():
    run = host_health.parse_active_load(json.dumps({"seconds": 6.1, "error": None, "samples": [
        {"gpu": 0, "pstate": "P0", "sm_mhz": 1980, "sm_max_mhz": 1980, "util_pct": 100, "power_w": 412.0, "reasons": []}]}), 0)
    assert run.load_s == 6.1 and run.samples[0].sm_mhz == 1980
    with pytest.raises(ProbeError):
        host_health.parse_active_load("Traceback (most recent call last):", 1)


def test_dcgm_diag_tables(fixture_text):
    assert host_health.parse_dcgm_diag(fixture_text("gpu-health", "dcgmi-diag-r1-pass.txt"), 0) == ("pass", "")
    result, detail = host_health.parse_dcgm_diag(fixture_text("gpu-health", "dcgmi-diag-r1-fail.txt"), 226)
    assert result == "fail" and detail == "Persistence Mode, Page Retirement/Row Remap"
    no_engine = "Error: unable to establish a connection to the specified host: localhost\nError: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
    assert host_health.parse_dcgm_diag(no_engine, 255)[0] == "unavailable"


def test_fabric_manager_version_and_state():
    fm = host_health.parse_fabric_manager("version:Fabric Manager version is : 535.129.03\nrunning:yes\nactive:active\nenabled:enabled\n", 4)
    assert (fm.nvswitches, fm.version, fm.running, fm.active, fm.enabled) == (4, "535.129.03", True, "active", "enabled")


def test_allreduce_results():
    ok, error = host_health.parse_allreduce('{"num_gpus": 8, "bytes": 268435456, "busbw_gbps": 461.2}', 0)
    assert error is None and ok.busbw_gbps == 461.2
    assert host_health.parse_allreduce("", 127)[1].startswith("no python")
    assert "hang" in host_health.parse_allreduce("", 124)[1]


def test_host_and_gpu_node_sections():
    host = host_health.parse_health_host(
        "hypervisor:yes\nshm:tmpfs 24684084 0 24684084 0% /dev/shm\nshm-mount:tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n")
    assert host["hypervisor"] and host["shm"].size_kib == 24684084
    nodes = host_health.parse_gpu_nodes("uvm-module:yes\ndevnode:/dev/nvidiactl\ndevnode:/dev/nvidia-uvm\ndevnode:/dev/nvidia0\n")
    assert nodes == {"uvm_loaded": True, "device_nodes": ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0")}
    assert host_health.parse_gpu_nodes("") == {"uvm_loaded": False, "device_nodes": ()}
