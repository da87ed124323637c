"""One deploy run's request, and the same request with one host's shape filled in."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from hosttune.config.inventory import Host
from hosttune.deploy.errors import DeployError
from hosttune.deploy.placement import PER_GPU
from hosttune.deploy.prune import DEFAULT_KEEP
from hosttune.deploy.settings import Overrides, Timeouts
from hosttune.deploy.shape import Shape, declared
from hosttune.fleet_runner import DEFAULT_FORKS


@dataclass(frozen=True)
class DeployRequest:
    """One deploy run. engine, model, port, tensor_parallel and replicas override the shape the inventory
    declares for this run; None leaves each to the inventory, else to what the host serves now."""

    engine: str | None
    model: str | None
    wheelhouse: Path
    gpus: str | None = None  # default: the inventory's `gpus` (all)
    port: int | None = None
    overrides: Overrides = field(default_factory=Overrides)
    ref: str | None = None  # pick the wheelhouse entry built from this ref (default: the newest)
    serial: int | None = None
    max_fail_percent: float | None = None
    forks: int = DEFAULT_FORKS
    timeouts: Timeouts = Timeouts()
    dry_run: bool = False
    tensor_parallel: int | None = None  # default: the smallest that divides the heads and fits
    replicas: str | None = None  # "per-gpu" or a count per host (default: declared, else live, else per-gpu)
    canary: int = 0  # hosts deployed (and checked) first, before the rest
    session_affinity: bool | None = None  # None: the inventory's deploy.session_affinity
    router: bool | None = None  # None: the inventory's deploy.router
    keys_dir: Path = Path("hosttune-keys")  # where deploy.api_key: true keeps each group's generated key
    tune_s: float = 0.0  # the bundled engine tunes its kernels on each host first, this long (0: no tune step)
    replicas_per_gpu: int | None = None  # replicas sharing each GPU (group) (default: declared, else live, else 1)
    keep_releases: int = DEFAULT_KEEP  # release folders each host keeps once a new one serves
    makes_keys: bool = True  # False for --dry-run: a group's generated API key not made yet is not made
    kept: tuple[str, ...] = ()  # the shape's replicas and tensor_parallel as the live release has them (no option
    #                             or inventory key said otherwise)

    @property
    def shape(self) -> Shape:
        return Shape(self.engine, self.model, self.replicas, self.tensor_parallel, self.port, self.replicas_per_gpu)


def for_host(host: Host, request: DeployRequest, live: Shape | None = None) -> DeployRequest:
    """The request with this host's shape filled in: the run's options, else the inventory's deploy:, else what is live."""
    shape = request.shape.over(declared(host).over(live or Shape()))
    if not shape.engine or not shape.model:
        missing = " and ".join(n for n, v in (("engine", shape.engine), ("model", shape.model)) if not v)
        raise DeployError(f"{host.name}: which {missing} to serve? Give --{missing.replace(' and ', ' and --')}, "
                          f"or declare deploy.{missing.replace(' and ', ' and deploy.')} in the inventory")
    said = request.shape.over(declared(host))
    kept = tuple(k for k in ("replicas", "tensor_parallel") if live and getattr(said, k) is None and getattr(live, k))
    return replace(request, engine=shape.engine, model=shape.model, replicas=shape.replicas or PER_GPU,
                   tensor_parallel=shape.tensor_parallel, port=shape.port, replicas_per_gpu=shape.replicas_per_gpu or 1,
                   kept=kept)


def kept_note(request: DeployRequest) -> str:
    """What a refused placement kept from the live release, so that the option it names is not taken for the user's."""
    if not request.kept:
        return ""
    what = {"replicas": f"{request.replicas} replicas", "tensor_parallel": f"TP {request.tensor_parallel}"}
    options = {"replicas": "--replicas", "tensor_parallel": "--tensor-parallel"}
    return (f"; the host serves {' at '.join(what[k] for k in request.kept)} now and this deploy keeps that: give "
            f"{' and '.join(options[k] for k in request.kept)} to change it")
