"""Engine presets: how to build and serve custom, vllm and sglang, as data (NAME.yaml here).

Values may name placeholders, filled in per host at deploy time: {venv} {model} {port}
{num_gpus} {num_nodes} {address} {head_address} {ray_port} (and {max_jobs} in build env).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml

from hosttune.errors import HosttuneError

ENGINES = ("custom", "vllm", "sglang")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


class PresetError(HosttuneError):
    """An engine preset, or an override of one, is malformed."""


@dataclass(frozen=True)
class Package:
    path: str  # a directory of the source checkout that pip turns into one wheel
    native: bool  # its wheel carries CUDA machine code, checked for every arch


@dataclass(frozen=True)
class BuildSpec:
    source: str  # git URL, or "engine" for this checkout's engine/ folder
    ref: str | None
    packages: tuple[Package, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)
    index_deps_gb: float = 0.0  # free space pip's install of the dependencies from an index takes (an estimate)


@dataclass(frozen=True)
class ServeSpec:
    command: tuple[str, ...]
    health: str = "/health"
    drain_s: int | None = None  # how long SIGTERM drains, when no flag says it
    drain_flag: str | None = None  # the flag that says how long SIGTERM drains
    false_flag: str | None = None  # how a false boolean flag is written ("no-{flag}"), else left out
    tp_flag: str | None = None  # the engine's tensor-parallel flag, given a replica's TP when it is above one
    api_key_env: str | None = None  # the environment variable the engine reads its API key from
    api_key_flag: str | None = None  # an engine that takes its key only as this flag gets it through a launcher
    env: dict[str, str] = field(default_factory=dict, hash=False)
    flags: dict[str, Any] = field(default_factory=dict, hash=False)
    help: tuple[str, ...] = ()  # the installed release's help, which every flag is checked against
    architectures: tuple[str, ...] = ()  # config.json architectures the engine loads; () any
    memory_flag: str | None = None  # the engine's share of its GPUs' memory; replicas sharing a GPU split it
    memory_share: float = 0.9  # that flag's value when neither the preset's flags nor the inventory set it
    shape_aliases: dict[str, str] = field(default_factory=dict, hash=False)  # flag → "model" | "tensor_parallel"
    gpu_flags: tuple[str, ...] = ()  # flags (pipeline, data parallel) that would give a replica more GPUs than its TP
    context_flag: str | None = None  # the context length, refused at start past the model's positions ...
    context_env: str | None = None  # ... unless this variable is set
    quant_methods: tuple[str, ...] = ()  # quantization_config quant_methods the engine loads; () any


@dataclass(frozen=True)
class MultinodeSpec:
    ray_port: int
    head_command: tuple[str, ...]
    worker_command: tuple[str, ...]
    flags: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class EngineRelease:
    """A release pinned for hosts whose driver's CUDA has this major version."""

    cuda: int
    ref: str
    torch: str
    flags: dict[str, Any] = field(default_factory=dict, hash=False)  # over serve.flags, for this release


@dataclass(frozen=True)
class EnginePreset:
    name: str
    build: BuildSpec
    serve: ServeSpec
    multinode: MultinodeSpec | None = None
    releases: tuple[EngineRelease, ...] = ()  # empty: one release for every host (build.ref)

    def release_for(self, cuda: str | None, host: str) -> EngineRelease | None:
        """The pinned release for a host whose driver supports this CUDA; None when the preset pins none.

        Raises PresetError naming what the host has and what the releases need."""
        if not self.releases:
            return None
        major = cuda_major(cuda)
        fitting = [r for r in self.releases if r.cuda == major]
        if not fitting:
            known = ", ".join(f"CUDA {r.cuda}.x → {self.name} {r.ref}" for r in self.releases)
            has = f"its driver supports CUDA {cuda}" if cuda else "no NVIDIA driver reports a CUDA version here"
            raise PresetError(f"{host}: {has}; {self.name} releases are pinned for {known}: "
                              f"{'update' if cuda else 'install'} the driver (hosttune apply) or deploy with --ref")
        return fitting[0]

    @property
    def is_bundled(self) -> bool:
        return self.build.source == "engine"


def substitute(text: str, values: Mapping[str, Any]) -> str:
    """Fill {placeholders}; an unknown one is a preset error naming it."""
    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise PresetError(f"unknown placeholder {{{name}}} in {text!r} (known: {', '.join(sorted(values))})")
        return str(values[name])

    return _PLACEHOLDER.sub(one, str(text))


@lru_cache(maxsize=None)
def load_preset(name: str) -> EnginePreset:
    if name not in ENGINES:
        raise PresetError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")
    text = resources.files("hosttune.presets").joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return parse_preset(yaml.safe_load(text), f"presets/{name}.yaml")


def cuda_major(version: str | None) -> int | None:
    """The major of a CUDA version ("12.4" -> 12), None where there is none."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _releases(items: list | None) -> tuple[EngineRelease, ...]:
    return tuple(EngineRelease(int(r["cuda"]), str(r["ref"]), str(r["torch"]), dict(r.get("flags") or {}))
                 for r in items or ())


def parse_preset(doc: dict, where: str) -> EnginePreset:
    try:
        build, serve = doc["build"], doc["serve"]
        packages = tuple(Package(str(p["path"]), bool(p["native"])) for p in build["packages"])
        build_spec = BuildSpec(str(build["source"]), build.get("ref"), packages, _strings(build.get("env")),
                               float(build.get("index_deps_gb", 0)))
        serve_spec = ServeSpec(
            tuple(serve["command"]), serve.get("health", "/health"), serve.get("drain_s"), serve.get("drain_flag"),
            serve.get("false_flag"), serve.get("tp_flag"), serve.get("api_key_env"), serve.get("api_key_flag"),
            _strings(serve.get("env")), dict(serve.get("flags") or {}), tuple(serve.get("help") or ()),
            tuple(str(a) for a in serve.get("architectures") or ()), serve.get("memory_flag"),
            float(serve.get("memory_share", 0.9)), dict(serve.get("shape_aliases") or {}),
            tuple(serve.get("gpu_flags") or ()), serve.get("context_flag"), serve.get("context_env"),
            tuple(str(m) for m in serve.get("quant_methods") or ()),
        )
        multi = doc.get("multinode")
        multi_spec = None if not multi else MultinodeSpec(
            int(multi["ray_port"]), tuple(multi["head_command"]), tuple(multi["worker_command"]), dict(multi.get("flags") or {}))
        return EnginePreset(str(doc["name"]), build_spec, serve_spec, multi_spec, _releases(doc.get("releases")))
    except (KeyError, TypeError, ValueError) as exc:
        raise PresetError(f"{where}: malformed preset ({exc!r})") from None


@dataclass(frozen=True)
class RouterPreset:
    """The prefix router deploy.router runs in front of a host's replicas (router.yaml)."""

    files: tuple[str, ...]  # hosttune/deploy's scripts it is made of, shipped as they are; the first one runs
    requirement: str  # what a machine outside a release installs to run it (the group router's)
    policy: str
    flags: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def script(self) -> str:
        return self.files[0]


@lru_cache(maxsize=None)
def load_router() -> RouterPreset:
    text = resources.files("hosttune.presets").joinpath("router.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    try:
        files = tuple(str(f) for f in doc["files"])
        if not files:
            raise ValueError("files is empty")
        return RouterPreset(files, str(doc["requirement"]), str(doc["policy"]), dict(doc.get("flags") or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise PresetError(f"presets/router.yaml: malformed ({exc!r})") from None


def _strings(env: Mapping | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (env or {}).items()}
