"""The testinfra suite `hosttune verify` runs against tuned hosts.

It checks hosts with testinfra's own modules (files, services, packages, sysctls, commands),
never with hosttune's probes, so it is an independent witness of what apply did. The
desired state comes from hosttune as JSON in $HOSTTUNE_VERIFY_EXPECT, one entry per host.

Run by `hosttune verify`; the repository's own test run skips this folder (no expectations).
"""
from __future__ import annotations

import json
import os

import pytest

EXPECT_ENV = "HOSTTUNE_VERIFY_EXPECT"

collect_ignore_glob = [] if os.environ.get(EXPECT_ENV) else ["test_*.py"]


@pytest.fixture(scope="module")
def want(host) -> dict:
    """This host's desired state (profile and inventory pins)."""
    with open(os.environ[EXPECT_ENV], encoding="utf-8") as fh:
        return json.load(fh)[host.backend.get_hostname()]


@pytest.fixture(scope="module")
def facts(host) -> dict:
    """What kind of host this is, read with plain commands."""
    virt = host.run("systemd-detect-virt --container")
    nvidia_pci = host.run("grep -lsx 0x10de /sys/bus/pci/devices/*/vendor").stdout.split()
    return {
        "container": virt.rc == 0,
        "systemd": host.file("/proc/1/comm").content_string.strip() == "systemd",
        "gpus": [p.rsplit("/", 2)[-2] for p in nvidia_pci],
        "nvidia_smi": host.exists("nvidia-smi"),
        "apt": host.exists("dpkg-query"),
        "dnf": host.exists("rpm") and not host.exists("dpkg-query"),
    }
