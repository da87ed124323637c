"""Where the service runs on a host: replicas × tensor parallel over its GPUs, each replica's GPUs,
NUMA node and port; and whether the host can run it at all.

Placement rules (docs/deploy.md shows them worked out for 4 and 8 GPUs):
- TP is --tensor-parallel, else the smallest that divides the model's attention heads (its KV
  heads split evenly or are replicated whole) and whose share of the weights fits one GPU with
  room left for the KV cache (WEIGHT_SHARE of its memory).
- Replicas: --replicas N, else as many as the GPUs hold (per-gpu: GPUs // TP, times
  --replicas-per-gpu: that many replicas share each group of TP GPUs, each with that
  fraction of its memory, and each replica's share of the weights must fit its part).
- A replica's GPUs share a NUMA node: each node's GPUs are cut into groups of TP in index
  order; only what is left over on the nodes is pooled into replicas spanning them.
- One replica serves on the service port itself; several serve on the ports after it and
  a host-local nginx on the service port balances over them.

Pure functions of the host's facts and the settings; nothing here talks to a host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hosttune import cpulist
from hosttune.deploy.errors import DeployError, PlacementError
from hosttune.deploy.model import ModelShape
from hosttune.probes.facts import Facts

CPU_DEVICE = "cpu"
PER_GPU = "per-gpu"
WEIGHT_SHARE = 0.75  # of a GPU's memory for its shard of the weights; the rest: KV cache, activations, graphs
MAX_TP = 64


@dataclass(frozen=True)
class Placement:
    gpus: tuple[int, ...]  # GPU indices as nvidia-smi numbers them (PCI bus order)
    numa_nodes: tuple[int, ...]  # the NUMA nodes of those GPUs; () when unknown or the host has one node
    numactl: str | None  # the numactl binary that binds them, when binding
    index: int = 0  # the replica's number on its host: hosttune-engine@INDEX.service
    port: int | None = None  # where the replica listens, when the host runs several
    tensor_parallel: int = 0  # 0: one rank per GPU; set for CPU replicas, which have no GPUs
    share: int = 1  # replicas on these same GPUs, this one among them: each gets 1/share of their memory

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))

    @property
    def num_gpus(self) -> int:
        return max(1, len(self.gpus))

    @property
    def tp(self) -> int:
        return self.tensor_parallel or self.num_gpus

    def numactl_prefix(self) -> tuple[str, ...]:
        if not self.numa_nodes or not self.numactl:
            return ()
        nodes = ",".join(map(str, self.numa_nodes))
        return (self.numactl, f"--cpunodebind={nodes}", f"--membind={nodes}")


def parse_gpus(gpus: str) -> tuple[int, ...]:
    """--gpus "0-3,5" → GPU indices; what does not parse is the user's error."""
    try:
        return cpulist.parse(gpus)
    except ValueError:
        raise DeployError(f"--gpus {gpus!r}: write GPU indices such as 0-3 or 0,2") from None


def select_gpus(gpus: str, facts: Facts, host: str) -> tuple[int, ...]:
    """--gpus "0-3" (or "all") → GPU indices, checked against the GPUs the host has (when it reports any)."""
    present = tuple(sorted(g.index for g in facts.gpu.gpus))
    if gpus == "all":
        return present
    wanted = parse_gpus(gpus)
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
    """All the selected GPUs as one replica (a multi-node group's host, or a one-replica layout)."""
    return place_gpus(select_gpus(gpus, facts, host), facts)


@dataclass(frozen=True)
class LayoutRequest:
    """--gpus, --tensor-parallel and --replicas as given (None: decide)."""

    gpus: str = "all"
    tensor_parallel: int | None = None
    replicas: str = PER_GPU  # "per-gpu" or a count
    device: str | None = None  # the engine's device flag: "cpu" places replicas without GPUs
    per_gpu: int = 1  # replicas sharing each group of TP GPUs


@dataclass(frozen=True)
class Layout:
    """A host's replicas, in start order; TP is the same for all of them."""

    replicas: tuple[Placement, ...]
    tensor_parallel: int
    reason: str  # how TP was chosen, for --dry-run and the docs

    @property
    def is_balanced(self) -> bool:
        """Several replicas: the service port is a host-local nginx over them."""
        return len(self.replicas) > 1

    @property
    def replicas_per_gpu(self) -> int:
        return self.replicas[0].share


def parse_replicas(text: str) -> str:
    """--replicas per-gpu | N."""
    if text == PER_GPU or (text.isdigit() and int(text) > 0):
        return text
    raise DeployError(f"--replicas {text!r}: write per-gpu or a number of replicas such as 2")


def plan_layout(request: LayoutRequest, facts: Facts, model: ModelShape, host: str, port: int) -> Layout:
    """Replicas × TP on this host's GPUs; raises DeployError (one line, what to change) when it cannot."""
    if request.device == CPU_DEVICE:
        if request.per_gpu > 1:
            raise DeployError(f"{host}: --replicas-per-gpu {request.per_gpu}: CPU replicas have no GPU to share; "
                              f"give --replicas instead")
        tp = request.tensor_parallel or 1
        _check_heads(tp, model, host)
        count = 1 if request.replicas == PER_GPU else int(request.replicas)
        replicas = tuple(Placement((), (), None, i, tensor_parallel=tp) for i in range(count))
        return Layout(_ports(replicas, port, host), tp, f"CPU replicas, TP {tp}")
    chosen = select_gpus(request.gpus, facts, host)
    if not chosen:
        raise DeployError(f"{host}: --gpus {request.gpus} selects no GPU")
    tp, reason = choose_tp(request.tensor_parallel, chosen, facts, model, host, request.per_gpu)
    groups = [g for g in gpu_groups(chosen, tp, facts) for _ in range(request.per_gpu)]
    if request.replicas != PER_GPU:
        wanted = int(request.replicas)
        if wanted > len(groups):
            sharing = f" and {request.per_gpu} replicas a GPU" if request.per_gpu > 1 else ""
            raise PlacementError(f"{host}: --replicas {wanted} at TP {tp}{sharing} needs "
                              f"{-(-wanted // request.per_gpu) * tp} GPUs, but --gpus {request.gpus} gives {len(chosen)}")
        groups = groups[:wanted]
    replicas = tuple(replace(place_gpus(g, facts), index=i, share=request.per_gpu) for i, g in enumerate(groups))
    if request.per_gpu > 1:
        reason += f"; {request.per_gpu} replicas a GPU, each with 1/{request.per_gpu} of its memory"
    return Layout(_ports(replicas, port, host), tp, reason)


def place_gpus(gpus: tuple[int, ...], facts: Facts) -> Placement:
    nodes = gpu_numa_nodes(gpus, facts)
    return Placement(gpus, nodes, facts.numactl if nodes else None)


def _ports(replicas: tuple[Placement, ...], port: int, host: str) -> tuple[Placement, ...]:
    if len(replicas) == 1:
        return (replace(replicas[0], port=port),)
    if port + len(replicas) > 65535:
        raise DeployError(f"{host}: {len(replicas)} replicas need ports {port + 1}-{port + len(replicas)}; use a lower --port")
    return tuple(replace(r, port=port + 1 + r.index) for r in replicas)


def divisors_of_heads(model: ModelShape, limit: int) -> list[int]:
    """The TPs up to limit that split the attention heads evenly (and the KV heads, or replicate them)."""
    return [tp for tp in range(1, limit + 1) if _splits(tp, model)]


def _splits(tp: int, model: ModelShape) -> bool:
    return _heads_split(tp, model) and not quant_problem(tp, model)


def _heads_split(tp: int, model: ModelShape) -> bool:
    if model.num_heads is None:
        return True
    kv = model.num_kv_heads or model.num_heads
    return model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def quant_problem(tp: int, model: ModelShape) -> str:
    """Why a 1/tp shard of the model's row-parallel layers cuts its quantization groups (blocks); "" when not."""
    unit = model.quant_unit
    cut = [n for n in model.row_inputs if unit and (n % tp or (n // tp) % unit)]
    return (f"a 1/{tp} shard of its {cut[0]} input columns ({cut[0] / tp:g}) is not whole {unit}-column {model.quant}"
            if cut else "")


def _check_heads(tp: int, model: ModelShape, host: str) -> None:
    fits = ", ".join(map(str, divisors_of_heads(model, max(tp, 8))))
    if not _heads_split(tp, model):
        raise PlacementError(f"{host}: --tensor-parallel {tp} does not divide {model.path}'s {model.num_heads} attention heads "
                          f"({model.num_kv_heads} KV heads); use one of {fits}")
    if quant_problem(tp, model):
        raise PlacementError(f"{host}: --tensor-parallel {tp} does not split {model.path}'s quantized weights: "
                          f"{quant_problem(tp, model)}; use one of {fits}")


def _gpu_bytes(gpus: tuple[int, ...], facts: Facts) -> int | None:
    sizes = [g.memory_total_mib for g in facts.gpu.gpus if g.index in gpus]
    return None if not sizes or None in sizes else min(sizes) * 2**20


def _shard_fits(tp: int, model: ModelShape, gpu_bytes: int | None) -> bool:
    return model.weight_bytes is None or gpu_bytes is None or model.weight_bytes / tp <= WEIGHT_SHARE * gpu_bytes


def choose_tp(requested: int | None, gpus: tuple[int, ...], facts: Facts, model: ModelShape, host: str,
              share: int = 1) -> tuple[int, str]:
    """TP as asked or the smallest that fits; with `share` replicas a GPU, each fits in 1/share of it."""
    whole = _gpu_bytes(gpus, facts)
    gpu_bytes = whole // share if whole else None
    memory = f"{gpu_bytes / 2**30:.0f} GiB" if gpu_bytes else "unknown"
    memory += f" (1/{share} of a GPU)" if share > 1 and gpu_bytes else ""
    fewer = f" or fewer than {share} replicas a GPU" if share > 1 else ""
    if requested is not None:
        if requested > len(gpus):
            raise PlacementError(f"{host}: --tensor-parallel {requested} needs {requested} GPUs, but --gpus gives {len(gpus)}")
        _check_heads(requested, model, host)
        if not _shard_fits(requested, model, gpu_bytes):
            raise PlacementError(f"{host}: a 1/{requested} shard of {model.path} ({model.weight_gb / requested:.1f} GB) is more "
                              f"than {WEIGHT_SHARE:.0%} of a GPU's {memory}; use a larger --tensor-parallel{fewer}")
        return requested, f"TP {requested} as asked"
    for tp in divisors_of_heads(model, len(gpus)):
        if _shard_fits(tp, model, gpu_bytes):
            return tp, (f"TP {tp}: the smallest that divides {model.num_heads or '?'} heads and fits "
                        f"{model.weight_gb / tp:.1f} GB of weights per GPU in {WEIGHT_SHARE:.0%} of {memory}")
    whole = f" and keeps its {model.quant_unit}-column {model.quant} whole" if model.quant_unit else ""
    raise PlacementError(f"{host}: {model.path} ({model.weight_gb:.1f} GB of weights) does not fit {len(gpus)} GPUs of "
                      f"{memory} at any TP that divides its {model.num_heads} heads{whole}; give it more GPUs{fewer}")


def gpu_groups(gpus: tuple[int, ...], tp: int, facts: Facts) -> list[tuple[int, ...]]:
    """GPUs cut into replicas of tp: within each NUMA node first, leftovers pooled across nodes."""
    by_node: dict[int | None, list[int]] = {}
    for gpu in gpus:
        by_node.setdefault(_node_of(gpu, facts), []).append(gpu)
    groups, leftover = [], []
    for node in sorted(by_node, key=lambda n: (n is None, n or 0)):
        members = by_node[node]
        whole = len(members) - len(members) % tp
        groups += [tuple(members[i:i + tp]) for i in range(0, whole, tp)]
        leftover += members[whole:]
    leftover.sort()
    groups += [tuple(leftover[i:i + tp]) for i in range(0, len(leftover) - len(leftover) % tp, tp)]
    return groups


def _node_of(gpu: int, facts: Facts) -> int | None:
    nodes = gpu_numa_nodes((gpu,), facts)
    return nodes[0] if nodes else None


def host_abi(facts: Facts) -> str | None:
    """ "3.11.2" → "cp311": the ABI a release venv on this host has."""
    if not facts.python_version:
        return None
    major, minor = facts.python_version.split(".")[:2]
    return f"cp{major}{minor}"


def preflight_host(facts: Facts, host: str, device: str | None) -> None:
    """Refuse, before anything changes, a host that cannot run the service at all."""
    if facts.pid1 != "systemd":
        raise DeployError(
            f"{host}: PID 1 is {facts.pid1 or 'unknown'!r}, not systemd: hosttune deploy runs the engine as a systemd "
            f"service (Restart=always, journal, ordered start) and does not supervise processes itself. "
            f"Deploy to a host booted with systemd, or run the engine in the foreground there "
            f"(hosttune-engine serve --model PATH ...)")
    if not facts.python_version:
        raise DeployError(f"{host}: no python3 found; the release virtualenv needs Python 3 with the venv module")
    if device != CPU_DEVICE and not facts.gpu.gpus:
        why = f" ({facts.gpu.error})" if facts.gpu.error else ""
        raise DeployError(f"{host}: no NVIDIA GPU found{why}; the engine needs one (the custom engine runs "
                          f"on CPU with --set device=cpu)")


def preflight(facts: Facts, host: str, placed: Placement | Layout, device: str | None) -> None:
    """Refuse, before anything changes, a host that cannot run the service as placed."""
    preflight_host(facts, host, device)
    replicas = placed.replicas if isinstance(placed, Layout) else (placed,)
    used = {i for r in replicas for i in r.gpus} if device != CPU_DEVICE else set()
    mig = cpulist.format(tuple(sorted(g.index for g in facts.gpu.gpus if g.index in used and g.mig_enabled)))
    if mig:  # CUDA runs on its instances only: a whole-GPU placement would see none, or a slice of it
        raise DeployError(f"{host}: GPU {mig} {'is' if mig.isdigit() else 'are'} in MIG mode, and hosttune deploy runs "
                          f"engines on whole GPUs; turn MIG off (the profile's gpu.mig: false, hosttune apply) or leave "
                          f"GPU {mig} out of --gpus")
    nodes = sorted({n for r in replicas for n in r.numa_nodes})
    if nodes and not facts.numactl:
        raise DeployError(f"{host}: the GPUs are on NUMA node {','.join(map(str, nodes))}, but numactl is missing to bind "
                          f"the service there; install it (hosttune apply fixes tools.numactl)")
