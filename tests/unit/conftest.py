"""Facts parsed from the recorded probe outputs, shared by the check, action and plan tests."""

import pytest

from hosttune.probes.gather import parse_probe_output


@pytest.fixture
def a100(fixture_text):
    """4 A100s on 2 NUMA nodes, with the problems its README lists."""
    return parse_probe_output(fixture_text("a100-4gpu-2numa", "probe-output.txt"))


@pytest.fixture
def l40s(fixture_text):
    """irqbalance running, deep C-states, an NVIDIA device with no driver loaded."""
    return parse_probe_output(fixture_text("irqbalance-deep-cstates", "probe-output.txt"))


@pytest.fixture
def h200(fixture_text):
    """The lent H200 host, recorded with the nvidia-smi XML fallback."""
    return parse_probe_output(fixture_text("h200", "probe-output.txt"))


@pytest.fixture
def h100(fixture_text):
    """8 H100s on 2 NUMA nodes, bare metal: intel_idle capped at C1 on the booted command line."""
    return parse_probe_output(fixture_text("h100-8gpu-2numa", "probe-output.txt"))


@pytest.fixture
def haltpoll_guest(fixture_text):
    """A VM guest whose cpuidle driver is haltpoll: before a grub drop-in, after it, after a boot that has it."""
    return {name: parse_probe_output(fixture_text("grub-dropin", f"{name}.txt")) for name in ("before", "after-apply", "after-reboot")}
