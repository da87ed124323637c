"""A deployment's shape: which engine serves which model, as how many replicas of which tensor
parallel size, on which port, and what guards it (API key, the host's nginx front, TLS).

Declared in the inventory's `deploy:` vars (defaults < group < host):

    deploy:
      engine: custom                 # custom, vllm or sglang
      model: /models/qwen2.5-7b      # the model folder on the hosts
      replicas: 2                    # or per-gpu
      tensor_parallel: 1             # GPUs per replica
      replicas_per_gpu: 1            # replicas sharing each GPU (group), each with its share of the memory
      port: 8000

A command-line option overrides its key for one run. A key neither gives keeps what the host
serves now: every release records its shape in its release.json, and the next deploy reads it
there, so a redeploy with no options never shrinks a host's replicas. Removing replicas, the
front or the key is named in the plan (`removals`), which deploy asks to confirm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

from hosttune.config.inventory import Host
from hosttune.deploy.errors import DeployError
from hosttune.deploy.placement import PER_GPU, parse_replicas
from hosttune.deploy.release import CURRENT
from hosttune.presets import ENGINES
from hosttune.transport.base import Transport

SHAPE_KEYS = ("engine", "model", "replicas", "tensor_parallel", "replicas_per_gpu")  # beside port, which settings.py reads


@dataclass(frozen=True)
class Shape:
    """What to serve; None: not said here (a lower layer decides)."""

    engine: str | None = None
    model: str | None = None
    replicas: str | None = None  # "per-gpu" or a count
    tensor_parallel: int | None = None
    port: int | None = None
    replicas_per_gpu: int | None = None

    def over(self, base: "Shape") -> "Shape":
        """This shape, with what it leaves open taken from `base`."""
        return replace(base, **{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None})


@dataclass(frozen=True)
class Guard:
    """What guards a release: its replicas, its key, its nginx front; recorded with it."""

    replicas: int = 1
    api_key: bool = False
    front_port: int | None = None

    def removals(self, new: "Guard") -> tuple[str, ...]:
        """What going from this guard to `new` takes away, in words for the plan."""
        out = []
        if new.replicas < self.replicas:
            out.append(f"removes {self.replicas - new.replicas} of the {self.replicas} replicas")
        if self.front_port and not new.front_port:
            out.append(f"removes the host's nginx front on port {self.front_port}")
        if self.api_key and not new.api_key:
            out.append("removes the API key: the engine will answer anyone who reaches it")
        return tuple(out)


def declared(host: Host) -> Shape:
    """The shape the host's `deploy:` vars declare; an error names the inventory line."""
    doc, where = host.deploy, host.source
    engine = doc.get("engine")
    if engine is not None and engine not in ENGINES:
        raise DeployError(f"{where}: deploy.engine must be one of {', '.join(ENGINES)} (got {engine!r})")
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not is_one_line(model)):
        raise DeployError(f"{where}: deploy.model must be the model folder on the hosts (got {model!r})")
    port = _count(doc, "port", where)
    if port is not None and port > 65535:
        raise DeployError(f"{where}: deploy.port must be a port number between 1 and 65535 (got {port})")
    return Shape(engine, model, _replicas(doc.get("replicas"), where), _count(doc, "tensor_parallel", where),
                 port, _count(doc, "replicas_per_gpu", where))


def is_one_line(text: str) -> bool:
    """Text a unit file can hold as one value: not empty, and no line break or NUL."""
    return bool(text) and not any(c in text for c in "\n\r\0")


def _replicas(value, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DeployError(f"{where}: deploy.replicas must be {PER_GPU} or a number of replicas (got {value!r})")
    try:
        return parse_replicas(str(value))
    except DeployError:
        raise DeployError(f"{where}: deploy.replicas must be {PER_GPU} or a number of replicas (got {value!r})") from None


def _count(doc: dict, key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DeployError(f"{where}: deploy.{key} must be a positive integer (got {value!r})")
    return value


def record(engine: str, model: str, port: int, replicas: int, tensor_parallel: int, guard: Guard,
           replicas_per_gpu: int = 1) -> dict:
    """The shape a release records in its release.json (`shape`): read back by the next deploy."""
    return {"engine": engine, "model": model, "port": port, "replicas": replicas, "tensor_parallel": tensor_parallel,
            "replicas_per_gpu": replicas_per_gpu, "api_key": guard.api_key, "front_port": guard.front_port}


def parse_live(text: str) -> tuple[Shape, Guard] | None:
    """The shape and guard of a live release from its release.json; older releases without a `shape`
    are read from their settings."""
    try:
        return shape_of(json.loads(text))
    except ValueError:
        return None


def shape_of(doc: dict) -> tuple[Shape, Guard] | None:
    """The shape and guard a release's release.json (as a dict: engine, settings) records; None: not readable."""
    try:
        settings = doc.get("settings") or {}
        shape = settings.get("shape") or _older(doc.get("engine"), settings)
        replicas = int(shape.get("replicas") or 1)
        return (Shape(shape.get("engine"), shape.get("model"), str(replicas), shape.get("tensor_parallel") or None,
                      shape.get("port"), shape.get("replicas_per_gpu") or None),
                Guard(replicas, bool(shape.get("api_key")), shape.get("front_port")))
    except (ValueError, TypeError, AttributeError):
        return None


def _older(engine: str | None, settings: dict) -> dict:
    replicas = settings.get("replicas") or []
    return {"engine": engine, "model": settings.get("model"), "port": settings.get("port"),
            "replicas": len(replicas) or 1, "tensor_parallel": settings.get("tensor_parallel"),
            "api_key": bool(settings.get("api_key"))}


def read_live(transport: Transport) -> tuple[Shape, Guard] | None:
    """What the host serves now (read-only); None when nothing is live."""
    result = transport.read(["cat", "--", f"{CURRENT}/.hosttune/release.json"], timeout=60)
    return parse_live(result.stdout) if result.ok else None
