"""Checks of the NVIDIA driver and CUDA toolkit stack."""

from __future__ import annotations

import re

from hosttune.checks.base import Check, gpu_unavailable, na, unmanaged
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict, show
from hosttune.config.profile import Profile

# The driver, the toolkit, and CUDA's math and communication libraries (an upgrade of libcublas,
# libcudnn or libnccl under a built engine breaks it as surely as a driver upgrade).
STACK_PACKAGE = re.compile(r"^(nvidia|libnvidia|cuda|libcuda|kmod-nvidia|datacenter-gpu|libcublas|libcudnn|libnccl)")

# Linux driver needed for full support of each CUDA toolkit (NVIDIA CUDA release notes, table 3).
FULL_SUPPORT = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03",
    "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
    "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
}
# Minimum driver for minor-version compatibility within a major release.
MINOR_COMPAT = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def in_branch(version: str, pin: str) -> bool:
    """535.129.03 meets pin 535.129.03, and pin 535 (the branch; the inventory takes a whole number)."""
    return version == pin or version.startswith(pin + ".")


def driver_version(facts: Facts, profile: Profile) -> Verdict:
    missing = gpu_unavailable(facts)
    if missing and not facts.gpu.kernel_module_version:
        return missing
    g = facts.gpu
    pin = profile.driver.version
    desired = pin or "module = userspace library (no pin)"
    loaded = g.kernel_module_version or g.driver_version
    userspace = g.library_version or g.driver_version
    if loaded and userspace and loaded != userspace:
        status = Status.PENDING_REBOOT if pin and in_branch(userspace, pin) else Status.DRIFT
        return Verdict(status, desired, userspace, loaded,
                       f"kernel module {loaded} but userspace library {userspace}: the next CUDA call fails with "
                       "'driver/library version mismatch' until the module is reloaded (reboot)")
    if pin is None:
        return Verdict(Status.OK, desired, userspace, loaded, "no driver pin in the profile or inventory")
    status = Status.OK if loaded and in_branch(loaded, pin) else Status.DRIFT
    return Verdict(status, pin, userspace, loaded, "" if status is Status.OK else f"driver {loaded} is not the pinned {pin}")


def driver_held(facts: Facts, profile: Profile) -> Verdict:
    if not profile.driver.held:
        return unmanaged("the profile does not ask for held packages")
    stack = sorted({p for p in (*facts.packages, *facts.held) if STACK_PACKAGE.match(p)})
    if not stack:
        return na("no driver or CUDA packages installed (a .run installer, or no GPU stack)", "held")
    unheld = [p for p in stack if p not in facts.held]
    held = [p for p in stack if p in facts.held]
    status = Status.OK if not unheld else Status.DRIFT
    detail = f"not held: {', '.join(unheld)}" if unheld else ""
    return Verdict(status, "driver and CUDA packages held", show(held), show(held), detail)


def _stale_toolkits(facts: Facts, pin: str) -> list[str]:
    """Other /usr/local/cuda-X.Y toolkits named on PATH or LD_LIBRARY_PATH."""
    stale = []
    for entry in facts.cuda.path + facts.cuda.ld_library_path:
        m = re.search(r"/cuda-(\d+\.\d+)", entry)
        if m and m.group(1) != pin and entry not in stale:
            stale.append(entry)
    return stale


def cuda_toolkit(facts: Facts, profile: Profile) -> Verdict:
    pin = profile.cuda.toolkit
    if pin is None:
        return unmanaged("no CUDA toolkit pin in the profile or inventory")
    c = facts.cuda
    stale = _stale_toolkits(facts, pin)
    others = [t for t in c.toolkits if not t.endswith(f"cuda-{pin}")]
    problems = []
    if c.nvcc_version != pin:
        problems.append(f"nvcc on the login PATH is {c.nvcc_version or 'missing'}")
    if c.symlink_version != pin:
        problems.append(f"/usr/local/cuda points at {c.symlink_target or 'nothing'}")
    if stale:
        problems.append(f"stale toolkit on PATH/LD_LIBRARY_PATH: {', '.join(stale)} (builds fail with 'undefined symbol')")
    detail = "; ".join(problems)
    if others and not problems:
        detail = f"other toolkits installed but not on any path: {', '.join(others)}"
    status = Status.DRIFT if problems else Status.OK
    return Verdict(status, pin, c.symlink_version, c.nvcc_version, detail)


def cuda_driver_compat(facts: Facts, profile: Profile) -> Verdict:
    pin = profile.cuda.toolkit
    driver = facts.gpu.kernel_module_version or facts.gpu.driver_version
    if pin is None:
        return unmanaged("no CUDA toolkit pin")
    if driver is None:
        return gpu_unavailable(facts) or na("no NVIDIA driver loaded")
    full = FULL_SUPPORT.get(pin)
    minimum = MINOR_COMPAT.get(pin.split(".")[0])
    desired = f"driver >= {full} for CUDA {pin}" if full else f"a driver supporting CUDA {pin}"
    if full and version_key(driver) >= version_key(full):
        return Verdict(Status.OK, desired, None, driver)
    if minimum and version_key(driver) >= version_key(minimum):
        return Verdict(Status.DRIFT, desired, None, driver,
                       f"minor-version compatibility only: CUDA {pin} runs on driver {driver}, but PTX JIT of newer "
                       f"code and some APIs fail; full support needs >= {full}")
    if full is None and minimum is None:
        return Verdict(Status.ERROR, desired, None, driver, f"no compatibility data for CUDA {pin}")
    return Verdict(Status.DRIFT, desired, None, driver, f"driver {driver} is too old for CUDA {pin} (needs >= {minimum or full})")


CHECKS = (
    Check("driver.version", "NVIDIA driver version", Severity.CRITICAL,
          "A driver that differs across the fleet or from its userspace libraries fails CUDA calls at the worst moment.",
          "install the pinned driver packages and reboot to load the matching kernel module", True, driver_version),
    Check("driver.held", "Driver and CUDA packages held", Severity.WARNING,
          "An unattended upgrade of an unheld driver swaps the userspace library under a running server.",
          "apt-mark hold (dnf versionlock add) the driver and CUDA packages", False, driver_held),
    Check("cuda.toolkit", "CUDA toolkit pin", Severity.CRITICAL,
          "Engine builds link against whatever toolkit is on PATH; a stale one breaks them with 'undefined symbol'.",
          "install the pinned toolkit's packages if it is missing, point /usr/local/cuda at it and write "
          "/etc/profile.d/hosttune-cuda.sh; stale toolkits are moved aside only with --prune-cuda", False, cuda_toolkit),
    Check("cuda.driver_compat", "CUDA toolkit supported by driver", Severity.WARNING,
          "A toolkit newer than the driver fully supports runs only under minor-version compatibility, without PTX JIT.",
          "install a driver with full support for the pinned toolkit (or pin an older toolkit)", True, cuda_driver_compat),
)
