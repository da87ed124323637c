"""Runs on the target host (shipped inside the probe script): GPU facts from NVML as JSON.

Standard library plus `pynvml` (nvidia-ml-py) only. Exit 3 when pynvml is missing,
4 when NVML cannot initialise, so the probe script falls back to nvidia-smi.
"""
import json
import sys

try:
    import pynvml as N
except ImportError:
    sys.exit(3)


def read(fn, *args):
    """(value, not_supported): value None where NVML gave none; not_supported where it said the GPU has no such thing."""
    try:
        value = fn(*args)
    except N.NVMLError as exc:
        return None, exc.value == N.NVML_ERROR_NOT_SUPPORTED
    except Exception:
        return None, False
    return (value.decode() if isinstance(value, bytes) else value), False


def get(fn, *args):
    return read(fn, *args)[0]


REASONS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}


def gpu(i):
    h = N.nvmlDeviceGetHandleByIndex(i)
    reasons_fn = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None) or N.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = get(reasons_fn, h)
    ecc, no_ecc = read(N.nvmlDeviceGetEccMode, h)
    mig, no_mig = read(N.nvmlDeviceGetMigMode, h)
    remap = get(N.nvmlDeviceGetRemappedRows, h)
    retired = get(N.nvmlDeviceGetRetiredPagesPendingStatus, h)
    cc = get(N.nvmlDeviceGetCudaComputeCapability, h)
    util = get(N.nvmlDeviceGetUtilizationRates, h)
    mem = get(N.nvmlDeviceGetMemoryInfo, h)
    pci = get(N.nvmlDeviceGetPciInfo, h)
    power = get(N.nvmlDeviceGetPowerUsage, h)
    limit = get(N.nvmlDeviceGetEnforcedPowerLimit, h)
    bounds = get(N.nvmlDeviceGetPowerManagementLimitConstraints, h)
    pstate = get(N.nvmlDeviceGetPerformanceState, h)
    pending = None
    if remap is not None:
        pending = bool(remap[2])
    elif retired is not None:
        pending = bool(retired)
    bus_id = pci.busId if pci is not None else ""
    return {
        "index": i,
        "name": get(N.nvmlDeviceGetName, h),
        "bdf": bus_id.decode() if isinstance(bus_id, bytes) else bus_id,
        "uuid": get(N.nvmlDeviceGetUUID, h),
        "pstate": None if pstate is None else f"P{pstate}",
        "persistence": None if get(N.nvmlDeviceGetPersistenceMode, h) is None else get(N.nvmlDeviceGetPersistenceMode, h) == 1,
        "compute_cap": None if cc is None else f"{cc[0]}.{cc[1]}",
        "sm_clock_mhz": get(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM),
        "sm_clock_max_mhz": get(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM),
        "power_draw_w": None if power is None else power / 1000.0,
        "power_limit_w": None if limit is None else limit / 1000.0,
        "power_limit_max_w": None if bounds is None else bounds[1] / 1000.0,
        "utilization_pct": None if util is None else util.gpu,
        "clock_event_reasons": [] if mask is None else [k for k, bit in REASONS.items() if mask & bit],
        "pcie_gen": get(N.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_gen_max": get(N.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_width": get(N.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_width_max": get(N.nvmlDeviceGetMaxPcieLinkWidth, h),
        "ecc_enabled": None if ecc is None else ecc[0] == 1,
        "ecc_pending": None if ecc is None else ecc[0] != ecc[1],
        "retirement_pending": pending,
        "mig_enabled": None if mig is None else mig[0] == 1,
        "mig_pending": None if mig is None else mig[0] != mig[1],
        "memory_total_mib": None if mem is None else mem.total // (1024 * 1024),
        "unsupported": [mode for mode, no in (("ecc", no_ecc), ("mig", no_mig)) if no],
    }


def main():
    try:
        N.nvmlInit()
    except Exception as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(4)
    try:
        cuda = get(N.nvmlSystemGetCudaDriverVersion)
        out = {
            "driver_version": get(N.nvmlSystemGetDriverVersion),
            "cuda_driver_version": None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            "gpus": [gpu(i) for i in range(N.nvmlDeviceGetCount())],
        }
    finally:
        N.nvmlShutdown()
    print(json.dumps(out))


main()
