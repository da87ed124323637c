"""Parsers on multi-GPU/multi-NUMA and irqbalance/deep-C-state hosts."""

from hosttune.probes.gather import parse_probe_output
from hosttune.probes.sections import split
from hosttune.probes.system import parse_sysctl_conf


def test_a100_multi_gpu_multi_numa(fixture_text):
    f = parse_probe_output(fixture_text("a100-4gpu-2numa", "probe-output.txt"))
    assert [e.split(":")[0] for e in f.probe_errors] == ["monitor", "health-host", "kernel-log", "pci-health"]  # an older probe's output
    assert f.gpu.source == "nvml" and len(f.gpu.gpus) == 4
    assert {g.compute_cap for g in f.gpu.gpus} == {"8.0"}
    assert [g.bdf for g in f.gpu.gpus] == [d.bdf for d in f.pci]
    assert [d.numa_node for d in f.pci] == [0, 0, 1, 1]
    assert f.numa_nodes == {0: tuple(range(32)), 1: tuple(range(32, 64))}
    assert f.pci[3].irqs[3].cpus == tuple(range(64))
    assert f.gpu.library_version == f.gpu.kernel_module_version == "535.129.03"
    assert f.held == ("nvidia-driver-535-server", "nvidia-kernel-common-535-server")
    assert f.cuda.nvcc_version == "11.8" and f.cuda.symlink_version == "12.4"
    assert f.services["nvidia-persistenced"].running is True  # comm is truncated to 15 chars
    assert f.services["irqbalance"].enabled == "masked"
    assert f.numa_balancing == 1 and f.numa_balancing_configured == 0
    assert [(d.name, d.power_state) for d in f.nvme] == [("nvme0", "D0"), ("nvme1", "D3hot")]


def test_irqbalance_and_deep_cstates(fixture_text):
    f = parse_probe_output(fixture_text("irqbalance-deep-cstates", "probe-output.txt"))
    svc = f.services["irqbalance"]
    assert (svc.active, svc.enabled, svc.running) == ("active", "enabled", True)
    assert f.cpu.intel_idle_max_cstate == 9
    assert [s[0] for s in f.cpu.idle_states] == ["POLL", "C1", "C1E", "C6"]
    assert f.cmdline_configured == ("quiet", "intel_idle.max_cstate=1", "processor.max_cstate=1")
    assert f.cmdline_param("intel_idle.max_cstate") is None
    assert f.gpu.gpus == () and f.gpu.pci_devices == ("0000:41:00.0",)
    assert "NVML Shared Library Not Found" in f.gpu.error


def test_sections_need_their_end_marker():
    sections = split("@@ht:a\nx\n@@ht-end:a:0\n@@ht:b\ntruncated")
    assert list(sections) == ["a"] and sections["a"].text == "x"


def test_sysctl_precedence():
    text = "\n".join([
        "/usr/lib/sysctl.d/50-default.conf:kernel.numa_balancing = 1",
        "/etc/sysctl.d/50-default.conf:kernel.numa_balancing = 0",
        "/etc/sysctl.d/10-early.conf:kernel.numa_balancing = 1",
    ])
    assert parse_sysctl_conf(text) == (0, "/etc/sysctl.d/50-default.conf")
    later = text + "\n/etc/sysctl.conf:kernel.numa_balancing=1"
    assert parse_sysctl_conf(later) == (1, "/etc/sysctl.conf")


def test_thp_boot_setting_read_past_a_leading_comment():
    from hosttune.probes.system import parse_system
    text = ("/etc/default/hosttune-thp:# Managed by hosttune (transparent hugepages).\n"
            "/etc/default/hosttune-thp:THP_MODE=never\n")
    assert parse_system(text)["thp_configured"] == "never"


def test_missing_usr_local_cuda_reads_nothing():
    from hosttune.checks.driver import cuda_toolkit
    from hosttune.probes.facts import Facts
    from hosttune.probes.software import parse_cuda
    from hosttune.config.profile import load_profile
    recorded = parse_cuda("symlink:/usr/local/cuda\ntoolkit:/usr/local/cuda-12.4\npath:/usr/bin:/bin\nld:\nnvcc:\n")
    assert recorded.symlink_target is None  # readlink -f of a missing link prints the link itself
    verdict = cuda_toolkit(Facts(cuda=recorded), load_profile("inference-latency"))
    assert "/usr/local/cuda points at nothing" in verdict.detail
