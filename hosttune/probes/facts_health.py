"""Health facts: GPU faults, fabric, PCI errors and shared memory, as read by the health probes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health fields from `nvidia-smi -q -x` (None where the GPU reports N/A)."""

    index: int
    bdf: str
    name: str = ""
    vbios: str | None = None
    virtualization: str | None = None  # "None", "Pass-Through", "VGPU", ...
    remap_corr: int | None = None
    remap_unc: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_banks_none: int | None = None  # banks with no spare rows left
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    sram_unc_volatile: int | None = None
    sram_unc_aggregate: int | None = None
    dram_unc_volatile: int | None = None
    dram_unc_aggregate: int | None = None
    sram_threshold_exceeded: bool | None = None
    unrepairable_memory: bool | None = None
    memory_missing: bool = False  # none of the remapped rows, retired pages or ECC errors in its output (N/A is read)
    recovery_action: str | None = None  # what the driver asks for: "None", "Reset", "Reboot", ...
    temp_c: int | None = None
    slowdown_margin_c: int | None = None  # degrees below the slowdown temperature
    power_limit_w: float | None = None  # enforced
    power_default_w: float | None = None
    app_clock_mhz: int | None = None
    app_clock_default_mhz: int | None = None
    fabric_state: str | None = None  # "Completed", "In Progress", "Not Started"; None: not an NVSwitch GPU
    fabric_status: str | None = None  # "Success" or an error


@dataclass(frozen=True)
class XidEvent:
    bdf: str  # as the kernel prints it, normalised: "0000:3b:00"
    code: int
    text: str  # the rest of the line after the code


@dataclass(frozen=True)
class KernelLog:
    source: str | None = None  # "dmesg" | "journal"; None: unreadable
    events: tuple[XidEvent, ...] = ()
    total: int = 0  # Xid lines in the log; events keeps the last ones
    read: bool = True  # False: the probe printed no kernel-log section (HealthFacts' default)


@dataclass(frozen=True)
class NvLink:
    gpu: int
    link: int
    active: bool
    speed_gbps: float | None = None


@dataclass(frozen=True)
class AerCounts:
    """A PCI function's AER counters since boot (sysfs aer_dev_*)."""

    bdf: str
    kind: str  # "gpu" | "nic" | "nvswitch"
    correctable: int = 0
    nonfatal: int = 0
    fatal: int = 0
    nonzero: tuple[tuple[str, int], ...] = ()  # (counter, value) of the counters above zero


@dataclass(frozen=True)
class BridgeAcs:
    """A PCIe switch port on the path to a GPU and its ACS control bits."""

    bdf: str
    gpu: str
    acs_ctl: int | None  # None: no ACS capability, or config space unreadable
    readable: bool = True


@dataclass(frozen=True)
class FabricManager:
    nvswitches: int = 0  # NVIDIA bridge functions (NVSwitch) on the PCI bus
    active: str | None = None
    enabled: str | None = None
    running: bool = False
    version: str | None = None


@dataclass(frozen=True)
class ShmFacts:
    size_kib: int | None = None
    used_kib: int | None = None
    fstype: str | None = None


@dataclass(frozen=True)
class CudaSmoke:
    """One GPU's CUDA smoke test: context, allocation, kernel, copy."""

    index: int
    bdf: str
    ok: bool
    error: str = ""
    ms: float | None = None


@dataclass(frozen=True)
class CudaRun:
    runtime: str | None = None  # "libcuda" | None (no CUDA driver library)
    error: str | None = None  # cuInit failed: the whole host is unusable
    gpus: tuple[CudaSmoke, ...] = ()


@dataclass(frozen=True)
class LoadSample:
    """One NVML sample of a GPU while the active load ran."""

    gpu: int
    pstate: str | None
    sm_mhz: int | None
    sm_max_mhz: int | None
    util_pct: int | None
    power_w: float | None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class AllReduce:
    num_gpus: int
    bytes: int
    busbw_gbps: float


@dataclass(frozen=True)
class ActiveRun:
    """What `check --active` measured; absent on a passive check."""

    load_s: float = 0.0
    load_error: str | None = None
    samples: tuple[LoadSample, ...] = ()
    diag: str | None = None  # "pass" | "fail" | "unavailable" (no nv-hostengine) | None (no DCGM)
    diag_detail: str = ""
    allreduce: AllReduce | None = None
    allreduce_error: str | None = None


@dataclass(frozen=True)
class HealthFacts:
    hypervisor: bool | None = None
    gpus: tuple[GpuHealth, ...] = ()
    kernel_log: KernelLog = field(default_factory=lambda: KernelLog(read=False))
    uvm_loaded: bool | None = None
    device_nodes: tuple[str, ...] = ()
    nvlinks: tuple[NvLink, ...] | None = None  # None: nvidia-smi nvlink not readable
    nvlink_errors: tuple[dict[str, int], ...] = ()  # two reads of "GPU.link.counter" -> value
    aer: tuple[AerCounts, ...] = ()
    iommu_types: dict[str, str] = field(default_factory=dict)  # GPU bdf -> iommu group type
    bridges: tuple[BridgeAcs, ...] = ()
    fabric: FabricManager = field(default_factory=FabricManager)
    shm: ShmFacts | None = None  # None: not read (the probe printed no health-host section)
    cuda: CudaRun | None = None  # None: the smoke test did not run
    active: ActiveRun | None = None
