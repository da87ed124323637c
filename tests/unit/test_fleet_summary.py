"""The fleet summary points out hosts whose facts differ from the rest of their group."""

from dataclasses import replace

from hosttune.checks import run_checks
from hosttune.checks.findings import Status
from hosttune.fleet import HostReport, outliers
from hosttune.config.inventory import Host
from hosttune.probes.gather import parse_probe_output
from hosttune.config.profile import load_profile
from hosttune.report.table import fleet_summary, render
from hosttune.transport.base import ConnectionSpec


def report(name, group, facts, reachable=True):
    findings = tuple(run_checks(facts, load_profile("inference-latency"))) if reachable else ()
    return HostReport(Host(name, group, ConnectionSpec(name)), "inference-latency", reachable,
                      facts if reachable else None, findings)


def test_outlier_driver_and_cuda_in_a_group(fixture_text):
    base = parse_probe_output(fixture_text("a100-4gpu-2numa", "probe-output.txt"))
    odd = replace(base, gpu=replace(base.gpu, kernel_module_version="550.54.14"),
                  cuda=replace(base.cuda, nvcc_version="12.4"))
    reports = [report("a1", "a100", base), report("a2", "a100", base), report("a3", "a100", odd),
               report("solo", "h200", base), report("gone", "a100", None, reachable=False)]
    found = {(o.host, o.fact): o for o in outliers(reports)}
    assert set(found) == {("a3", "driver"), ("a3", "cuda")}
    assert found[("a3", "driver")].majority == "535.129.03" and found[("a3", "driver")].value == "550.54.14"
    lines = fleet_summary(reports)
    assert lines[0] == "fleet: 5 hosts, 0 clean, 4 with findings or errors, 1 unreachable"
    assert "outlier: a3 [a100] driver = '550.54.14' (group has '535.129.03')" in lines
    assert "unreachable: gone" in lines


def test_two_hosts_that_disagree_have_no_majority(fixture_text):
    base = parse_probe_output(fixture_text("a100-4gpu-2numa", "probe-output.txt"))
    other = replace(base, kernel="6.8.0-49-generic")
    found = outliers([report("x", "g", base), report("y", "g", other)])
    assert {(o.host, o.majority) for o in found} == {("x", None), ("y", None)}


def test_a_host_without_a_gpu_says_so_in_one_line_naming_the_checks(fixture_text):
    facts = parse_probe_output(fixture_text("a100-4gpu-2numa", "probe-output.txt"))
    findings = [run_checks(facts, load_profile("inference-latency"))[0]]
    for check_id, reason in (("gpu.count", "no NVIDIA GPU on this host"), ("gpu.ecc", "no NVIDIA GPU on this host"),
                             ("nvme.power", "no NVMe devices")):
        findings.append(replace(findings[0], check_id=check_id, status=Status.NOT_APPLICABLE, detail=reason))
    cpu_only = HostReport(Host("cpu-only", "cpu", ConnectionSpec("cpu-only")), "inference-latency", True, facts,
                          tuple(findings))
    text = render([cpu_only, report("other", "cpu", None, reachable=False)])
    assert "  n/a     no NVIDIA GPU on this host: gpu.count, gpu.ecc\n" in text
    assert "  n/a     no NVMe devices: nvme.power\n" in text and text.count("no NVIDIA GPU") == 1
    assert "fleet: 2 hosts" in text and fleet_summary([cpu_only])[0].startswith("fleet: 1 host, ")
    assert "gpu.count" in render([cpu_only], verbose=True) and "no NVIDIA GPU on this host:" not in render([cpu_only], verbose=True)


def test_a_kernel_command_line_differing_only_in_its_own_disk_or_address_is_no_outlier(fixture_text):
    """root=UUID=…, resume= and ip= name each host's own disk and address: only the tuning words are compared."""
    base = parse_probe_output(fixture_text("a100-4gpu-2numa", "probe-output.txt"))
    tuned = tuple(w for w in base.cmdline_active if not w.startswith("root="))

    def own(n: int, words=tuned):
        return replace(base, cmdline_active=(*words, f"root=UUID=0000000{n}-aaaa", f"resume=UUID=f{n}",
                                             f"ip=10.0.0.{n}::10.0.0.254:255.255.255.0"))

    untuned = own(4, tuple(w for w in tuned if not w.startswith("rcu_nocbs=")))
    found = outliers([report(f"a{n}", "a100", own(n)) for n in (1, 2, 3)] + [report("a4", "a100", untuned)])
    assert [(o.host, o.fact) for o in found] == [("a4", "cmdline")], found
    assert "root=" not in found[0].value and "rcu_nocbs=4-63" in found[0].majority
