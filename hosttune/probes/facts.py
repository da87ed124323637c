"""What a host is, as read by the probes: plain frozen dataclasses, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field

from hosttune.probes.facts_health import HealthFacts
from hosttune.probes.facts_serve import MonitorFacts, ServeFacts


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML (or nvidia-smi) reports it."""

    index: int
    name: str
    bdf: str  # PCI address, normalised to "0000:00:06.0"
    uuid: str = ""
    pstate: str | None = None
    persistence: bool | None = None
    compute_cap: str | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    power_limit_max_w: float | None = None
    utilization_pct: int | None = None
    clock_event_reasons: tuple[str, ...] = ()
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None
    retirement_pending: bool | None = None
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    memory_total_mib: int | None = None
    unsupported: tuple[str, ...] = ()  # modes the GPU's driver said it has none of ("ecc", "mig"): N/A, NOT_SUPPORTED


@dataclass(frozen=True)
class GpuFacts:
    """The GPU stack: devices, driver versions, and where the numbers came from."""

    source: str = "none"  # "nvml" | "nvidia-smi-xml" | "nvidia-smi-csv" | "none"
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None  # what NVML / nvidia-smi report
    kernel_module_version: str | None = None  # /proc/driver/nvidia/version
    library_version: str | None = None  # libnvidia-ml.so.<version> on disk
    cuda_driver_version: str | None = None  # highest CUDA the driver supports
    pci_devices: tuple[str, ...] = ()  # NVIDIA display/3D controllers on the PCI bus
    error: str | None = None  # why NVML and nvidia-smi both failed, if they did


@dataclass(frozen=True)
class IrqAffinity:
    irq: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class PciDevice:
    """A GPU's PCI function in sysfs: NUMA placement, power state and MSI IRQs."""

    bdf: str
    numa_node: int | None  # None when the kernel reports -1 (no NUMA info)
    local_cpus: tuple[int, ...] = ()
    power_state: str | None = None
    link_speed: str | None = None
    link_width: int | None = None
    max_link_speed: str | None = None
    max_link_width: int | None = None
    irqs: tuple[IrqAffinity, ...] = ()


@dataclass(frozen=True)
class CudaFacts:
    nvcc_version: str | None = None  # of the nvcc a login shell finds on PATH
    nvcc_path: str | None = None
    symlink_target: str | None = None  # /usr/local/cuda → ...
    symlink_version: str | None = None
    toolkits: tuple[str, ...] = ()  # /usr/local/cuda-* directories
    path: tuple[str, ...] = ()  # login PATH
    ld_library_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineEndpoint:
    """A port of the deployed engine (or of the host nginx in front of it), asked for /v1/models without a key."""

    role: str  # "engine" | "nginx"
    port: int
    scheme: str  # "http" | "https"
    listen: tuple[str, ...]  # the addresses it listens on
    status: str  # the HTTP status without a key ("200", "401"), "closed", or "error: ..."

    @property
    def is_exposed(self) -> bool:
        """It listens beyond the loopback interface."""
        return any(not (a.startswith("127.") or a == "::1" or a == "0000:0000:0000:0000:0000:0000:0000:0001")
                   for a in self.listen)


@dataclass(frozen=True)
class ServiceState:
    """A systemd unit: active is 'active'/'inactive'/..., enabled is 'enabled'/'disabled'/..."""

    name: str
    active: str | None = None
    enabled: str | None = None
    running: bool | None = None  # a process of that name exists (works without systemd)
    script: str | None = None  # sha256 of hosttune's boot script the unit runs (/usr/local/sbin/NAME), where it has one


@dataclass(frozen=True)
class CpuFacts:
    count: int = 0
    online: tuple[int, ...] = ()  # /sys/devices/system/cpu/online
    governors: dict[int, str] = field(default_factory=dict)
    idle_driver: str | None = None
    idle_states: tuple[tuple[str, bool, int], ...] = ()  # (name, disabled, exit latency µs) of cpu0
    intel_idle_max_cstate: int | None = None


@dataclass(frozen=True)
class NvmeDevice:
    name: str
    model: str = ""
    power_state: str | None = None


@dataclass(frozen=True)
class Facts:
    """Everything one probe round trip learnt about a host."""

    hostname: str = ""
    machine_id: str = ""  # /etc/machine-id as read (probes/machine.py: which machine this is, against a cloned disk)
    machine_id_transient: bool | None = None  # that id is gone at the next boot (mounted over the file, or on a tmpfs
    # root); None: not read (an image, or a probe of an older hosttune)
    image: str = ""  # apply --root: the image directory these facts were read from ("" for a running host)
    os_id: str = ""
    os_version: str = ""
    os_like: tuple[str, ...] = ()
    kernel: str = ""
    pid1: str = ""
    is_root: bool | None = None
    cmdline_active: tuple[str, ...] = ()
    cmdline_configured: tuple[str, ...] | None = None  # None: no bootloader config found
    cmdline_source: str = ""
    grub_overrides: tuple[str, ...] = ()  # grub drop-ins read after hosttune's that set the default command line anew
    gpu: GpuFacts = field(default_factory=GpuFacts)
    pci: tuple[PciDevice, ...] = ()
    gpu_interrupts: dict[int, tuple[int, ...]] = field(default_factory=dict)  # IRQ → count per CPU, since boot
    gpu_interrupts_later: dict[int, tuple[int, ...]] = field(default_factory=dict)  # the same, read at the probe's end
    cuda: CudaFacts = field(default_factory=CudaFacts)
    packages: dict[str, str] = field(default_factory=dict)  # name → version (driver/CUDA stack)
    held: tuple[str, ...] = ()
    package_manager: str | None = None  # "apt" | "dnf" | None
    services: dict[str, ServiceState] = field(default_factory=dict)
    cpu: CpuFacts = field(default_factory=CpuFacts)
    numa_nodes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    numa_balancing: int | None = None
    numa_balancing_configured: int | None = None
    numa_balancing_source: str = ""
    numa_balancing_files: tuple[tuple[str, str], ...] = ()  # (file, value) of each sysctl file a boot reads that sets it, in order
    thp_enabled: str | None = None
    thp_configured: str | None = None
    nvme: tuple[NvmeDevice, ...] = ()
    nvme_ps_max_latency_us: int | None = None
    numactl: str | None = None
    python_version: str | None = None
    pythons: tuple[str, ...] = ()
    health: HealthFacts = field(default_factory=HealthFacts)  # GPU faults, fabric, PCI errors, /dev/shm
    engine_endpoints: tuple[EngineEndpoint, ...] | None = None  # None: not probed (no python3)
    monitor: MonitorFacts = field(default_factory=MonitorFacts)  # hosttune's own timers on the host (apply's monitor)
    serve: ServeFacts | None = None  # the deployed engine's units, ports and front; None: nothing deployed (or no python3)
    probe_errors: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()  # sections the probe always prints that its output lacks (cut short, another version)

    def cmdline_param(self, key: str, configured: bool = False) -> str | None:
        """The last value of key=... on the active (or configured) kernel command line."""
        words = self.cmdline_configured if configured else self.cmdline_active
        value = None
        for word in words or ():
            name, _, val = word.partition("=")
            if name == key:
                value = val
        return value
