"""Where the service runs on a host: which GPUs, which NUMA node; and whether the host can run it at all.

Pure functions of the host's facts and the settings; nothing here talks to a host.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosttune import cpulist
from hosttune.deploy.errors import DeployError
from hosttune.facts import Facts

CPU_DEVICE = "cpu"


@dataclass(frozen=True)
class Placement:
    gpus: tuple[int, ...]  # GPU indices as nvidia-smi numbers them (PCI bus order)
    numa_nodes: tuple[int, ...]  # the NUMA nodes of those GPUs; () when unknown or the host has one node
    numactl: str | None  # the numactl binary that binds them, when binding

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))

    @property
    def num_gpus(self) -> int:
        return max(1, len(self.gpus))

    def numactl_prefix(self) -> tuple[str, ...]:
        if not self.numa_nodes or not self.numactl:
            return ()
        nodes = ",".join(map(str, self.numa_nodes))
        return (self.numactl, f"--cpunodebind={nodes}", f"--membind={nodes}")


def select_gpus(gpus: str, facts: Facts, host: str) -> tuple[int, ...]:
    """--gpus "0-3" (or "all") → GPU indices, checked against the GPUs the host has (when it reports any)."""
    present = tuple(sorted(g.index for g in facts.gpu.gpus))
    if gpus == "all":
        return present
    try:
        wanted = cpulist.parse(gpus)
    except ValueError:
        raise DeployError(f"--gpus {gpus!r}: write GPU indices such as 0-3 or 0,2") from None
    missing = [i for i in wanted if present and i not in present]
    if missing:
        raise DeployError(f"{host}: --gpus {gpus} asks for GPU {','.join(map(str, missing))}, "
                          f"but the host has GPUs {cpulist.format(present)}")
    return wanted


def gpu_numa_nodes(gpus: tuple[int, ...], facts: Facts) -> tuple[int, ...]:
    """The NUMA nodes the GPUs hang off; () when any is unknown or the host has a single node."""
    if len(facts.numa_nodes) < 2:
        return ()
    bdf_of = {g.index: g.bdf for g in facts.gpu.gpus}
    node_of = {d.bdf: d.numa_node for d in facts.pci}
    nodes = [node_of.get(bdf_of.get(i, "")) for i in gpus]
    if not nodes or any(n is None for n in nodes):
        return ()
    return tuple(sorted(set(nodes)))


def place(gpus: str, facts: Facts, host: str) -> Placement:
    chosen = select_gpus(gpus, facts, host)
    nodes = gpu_numa_nodes(chosen, facts)
    return Placement(chosen, nodes, facts.numactl if nodes else None)


def host_abi(facts: Facts) -> str | None:
    """ "3.11.2" → "cp311": the ABI a release venv on this host has."""
    if not facts.python_version:
        return None
    major, minor = facts.python_version.split(".")[:2]
    return f"cp{major}{minor}"


def preflight(facts: Facts, host: str, placement: Placement, device: str | None) -> None:
    """Refuse, before anything changes, a host that cannot run the service as asked."""
    if facts.pid1 != "systemd":
        raise DeployError(
            f"{host}: PID 1 is {facts.pid1 or 'unknown'!r}, not systemd: hosttune deploy runs the engine as a systemd "
            f"service (Restart=always, journal, ordered start) and does not supervise processes itself. "
            f"Deploy to a host booted with systemd, or run the engine in the foreground there "
            f"(hosttune-engine serve --model PATH ...)")
    if not facts.python_version:
        raise DeployError(f"{host}: no python3 found; the release virtualenv needs Python 3 with the venv module")
    if placement.numa_nodes and not facts.numactl:
        nodes = ",".join(map(str, placement.numa_nodes))
        raise DeployError(f"{host}: the GPUs are on NUMA node {nodes}, but numactl is missing to bind the service "
                          f"there; install it (hosttune apply fixes tools.numactl)")
    if device != CPU_DEVICE and not facts.gpu.gpus:
        why = f" ({facts.gpu.error})" if facts.gpu.error else ""
        raise DeployError(f"{host}: no NVIDIA GPU found{why}; the engine needs one (the custom engine runs "
                          f"on CPU with --set device=cpu)")
