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
