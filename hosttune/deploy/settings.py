"""What to serve on each host: the preset's flags, overridden by the inventory's `deploy:` vars
(defaults < group < host), overridden by `--set`.

Inventory layout (every key optional):

    deploy:
      engine: custom                     # the shape (hosttune.deploy.shape): engine, model,
      model: /models/qwen2.5-7b          # replicas, tensor_parallel and port
      replicas: 2
      tensor_parallel: 1
      port: 8000
      env: {NCCL_DEBUG: WARN}            # extra environment for the service
      vllm: {max-model-len: 32768}       # flags of one engine; null leaves a preset flag out
      multinode: true                    # vLLM: the group's hosts serve one model together (Ray)
      lb_port: 8080                      # nginx listen port for a group of several replicas
      warmup: 3                          # warmup requests before the gate
      health_timeout: 900                # seconds for the service to load and say healthy
      gate_timeout: 60                   # seconds for the one-token generation
      probe_interval: 10                 # seconds between generation probes of a host's replicas
      session_affinity: false            # host-local nginx: one X-Session-Id keeps its replica
      router: false                      # a prefix router between the host's nginx and its replicas

`--set FLAG=VALUE` sets an engine flag, `--set env.NAME=VALUE` an environment variable;
values are read as YAML scalars (true, 0.9, 8192, null); unquoted text YAML would cut ('a #b') is taken as given.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

import yaml

from hosttune.deploy.errors import DeployError
from hosttune.config.inventory import Host
from hosttune.config.unit_text import SCALARS as _SCALARS, unit_text_error
from hosttune.presets import ENGINES, EnginePreset, substitute

DEFAULT_PORT = 8000
_FLAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Overrides:
    """--set, parsed."""

    flags: dict[str, Any] = field(default_factory=dict, hash=False)
    env: dict[str, str | None] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ServeSettings:
    """One host's serving settings, resolved."""

    engine: str
    model: str
    port: int
    flags: dict[str, Any] = field(hash=False)
    env: dict[str, str] = field(hash=False)
    multinode: bool = False
    lb_port: int | None = None
    warmup: int = 3
    health_timeout_s: float = 600.0
    gate_timeout_s: float = 60.0
    probe_interval_s: int = 10
    session_affinity: bool = False
    router: bool = False  # hosttune.deploy.router: requests go to the replica that holds their prefix


@dataclass(frozen=True)
class Timeouts:
    """--warmup, --health-timeout and --gate-timeout; None leaves the inventory's value (or the default)."""

    warmup: int | None = None
    health_timeout_s: float | None = None
    gate_timeout_s: float | None = None

    def apply(self, settings: ServeSettings) -> ServeSettings:
        return replace(settings, **{k: v for k, v in asdict(self).items() if v is not None})


def _text(value: Any, where: str) -> str:
    """The value as the unit line gets it; what no unit line can carry is refused (config/unit_text.py)."""
    why = unit_text_error(value)
    if why:
        raise DeployError(f"{where}: {why}")
    return str(value)


def parse_sets(items: tuple[str, ...] | list[str]) -> Overrides:
    flags: dict[str, Any] = {}
    env: dict[str, str | None] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise DeployError(f"--set {item!r}: write KEY=VALUE (an engine flag, or env.NAME for the environment)")
        _refuse_control(key, raw)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if not isinstance(value, _SCALARS) or _cut(raw, value):
            value = raw  # "[a, b]" and the like stay text: flags take scalars; so does "a #b" (no comment here)
        if key.startswith("env."):
            env[_env_name(key[4:], f"--set {item}")] = None if value is None else _text(value, f"--set {item}")
        else:
            flags[_flag_name(key, f"--set {item}")] = value
            _text(value, f"--set {item}")
    return Overrides(flags, env)


def _cut(raw: str, value: Any) -> bool:
    """YAML read an unquoted text as less than it is (a ' #' comment dropped)."""
    text = raw.strip()
    return isinstance(value, str) and not text.startswith(("'", '"')) and value != text


def _refuse_control(key: str, raw: str) -> None:
    """Before YAML reads it: YAML would fold a newline to a space, and a unit line holds one line of text."""
    _text(raw, f"--set {key}")


def _flag_name(name: str, where: str) -> str:
    name = name.removeprefix("--")
    if not _FLAG.match(name):
        raise DeployError(f"{where}: {name!r} is not a flag name (letters, digits, '-' and '_')")
    return name


def _env_name(name: str, where: str) -> str:
    if not _ENV.match(name):
        raise DeployError(f"{where}: {name!r} is not an environment variable name")
    return name


def _number(doc: Mapping, key: str, kind: type, where: str, default: Any) -> Any:
    value = doc.get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)) or value < 0:
        raise DeployError(f"{where}: deploy.{key} must be a non-negative {'integer' if kind is int else 'number'} (got {value!r})")
    return value


def _seconds(doc: Mapping, key: str, where: str, default: float) -> float:
    """A timeout: at least a second, as the CLI's options are (0 would fail every gate)."""
    value = _number(doc, key, float, where, default)
    if value < 1:
        raise DeployError(f"{where}: deploy.{key} must be at least 1 second (got {value!r})")
    return value


def _port(doc: Mapping, key: str, where: str, default: int | None) -> int | None:
    value = _number(doc, key, int, where, default)
    if value is not None and not 1 <= value <= 65535:
        raise DeployError(f"{where}: deploy.{key} must be a port number between 1 and 65535 (got {value})")
    return value


KNOWN_KEYS = {"port", "env", "multinode", "lb_port", "warmup", "health_timeout", "gate_timeout", "probe_interval",
              "session_affinity", "router", *ENGINES,
              "engine", "model", "replicas", "tensor_parallel", "replicas_per_gpu",  # hosttune.deploy.shape
              "api_key", "api_key_file", "nginx", "lb_plain_http"}  # hosttune.deploy.access, balancer


def inventory_vars(host: Host) -> dict:
    """The host's `deploy:` vars, checked; errors name the inventory line of the host."""
    doc, where = host.deploy, host.source
    unknown = set(doc) - KNOWN_KEYS
    if unknown:
        raise DeployError(f"{where}: deploy.{sorted(unknown)[0]}: unknown key (expected one of: {', '.join(sorted(KNOWN_KEYS))})")
    for name in (*ENGINES, "env"):
        if not isinstance(doc.get(name, {}), dict):
            raise DeployError(f"{where}: deploy.{name} must be a mapping")
    for name in ("multinode", "session_affinity", "router"):
        if not isinstance(doc.get(name, False), bool):
            raise DeployError(f"{where}: deploy.{name} must be true or false")
    return doc


def resolve(host: Host, preset: EnginePreset, model: str, port: int | None, overrides: Overrides,
            timeouts: Timeouts = Timeouts()) -> ServeSettings:
    """Preset < inventory (defaults < group < host) < --set."""
    doc, where = inventory_vars(host), host.source
    flags = dict(preset.serve.flags)
    for name, value in doc.get(preset.name, {}).items():
        flags[_flag_name(str(name), f"{where}: deploy.{preset.name}")] = value
        _text(value, f"{where}: deploy.{preset.name}.{name}")
    _refuse_shape_flags(preset, doc.get(preset.name, {}), f"{where}: deploy.{preset.name}.")
    _refuse_shape_flags(preset, overrides.flags, "--set ")
    flags.update(overrides.flags)
    env = dict(preset.serve.env)
    env.update({_env_name(str(k), f"{where}: deploy.env"): _text(v, f"{where}: deploy.env.{k}")
                for k, v in doc.get("env", {}).items()})
    _refuse_placement_env(doc.get("env", {}), f"{where}: deploy.env.")
    _refuse_placement_env(overrides.env, "--set env.")
    for name, value in overrides.env.items():
        env.pop(name, None) if value is None else env.__setitem__(name, value)
    chosen_port = port if port is not None else _port(doc, "port", where, DEFAULT_PORT)
    return timeouts.apply(ServeSettings(
        preset.name, model, chosen_port, flags, env, doc.get("multinode", False), _port(doc, "lb_port", where, None),
        _number(doc, "warmup", int, where, 3), _seconds(doc, "health_timeout", where, 600.0),
        _seconds(doc, "gate_timeout", where, 60.0),
        max(1, _number(doc, "probe_interval", int, where, 10)), doc.get("session_affinity", False),
        doc.get("router", False),
    ))


SHAPE_OPTIONS = {"{model}": ("--model", "deploy.model"), "{port}": ("--port", "deploy.port")}
ALIAS_OPTIONS = {"model": SHAPE_OPTIONS["{model}"], "tensor_parallel": ("--tensor-parallel", "deploy.tensor_parallel")}


def _refuse_shape_flags(preset: EnginePreset, given: Mapping[str, Any], where: str) -> None:
    """Flags hosttune sets from the deployment's shape (model, port, each replica's TP) are not engine flags to
    override: the gate, nginx and the placement follow the shape, and would not follow the flag."""
    shaped = {name: option for name, value in preset.serve.flags.items()
              for holder, option in SHAPE_OPTIONS.items() if holder in str(value)}
    if preset.serve.tp_flag:
        shaped[preset.serve.tp_flag] = ALIAS_OPTIONS["tensor_parallel"]
    shaped.update({flag: ALIAS_OPTIONS[kind] for flag, kind in preset.serve.shape_aliases.items()})
    for name, value in given.items():
        option = shaped.get(str(name).removeprefix("--"))
        if option:
            raise DeployError(f"{where}{name}: hosttune sets --{str(name).removeprefix('--')} from the deployment's "
                              f"shape; give {option[0]} (or {option[1]}) instead")
        if str(name).removeprefix("--") in preset.serve.gpu_flags and value is not None and str(value) != "1":
            raise DeployError(f"{where}{name}={value}: a replica runs on the --tensor-parallel GPUs hosttune places it "
                              f"on, and --{str(name).removeprefix('--')} {value} would need {value} times as many; give "
                              f"--tensor-parallel and --replicas (or deploy.tensor_parallel and deploy.replicas) instead")


def _refuse_placement_env(given: Mapping[str, Any], where: str) -> None:
    """CUDA_VISIBLE_DEVICES is each replica's GPUs, which hosttune sets from the placement: the NUMA binding, the
    checks of tensor parallelism against the GPUs and the remediation of a GPU's faults follow the placement, and
    would not follow the variable."""
    if "CUDA_VISIBLE_DEVICES" in given:
        raise DeployError(f"{where}CUDA_VISIBLE_DEVICES: hosttune sets it from the deployment's GPUs; give --gpus "
                          "(or the inventory's gpus) instead")
    if "CUDA_DEVICE_ORDER" in given:
        raise DeployError(f"{where}CUDA_DEVICE_ORDER: hosttune sets it to PCI_BUS_ID, the order nvidia-smi numbers the "
                          "GPUs in, which --gpus and the placement use; drop it")


def flag_argv(flags: Mapping[str, Any], values: Mapping[str, Any], false_flag: str | None) -> list[str]:
    """--name value pairs: true is a bare --name, false is the preset's negation or nothing, null nothing."""
    argv: list[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            if false_flag:
                argv.append("--" + false_flag.replace("{flag}", name))
        else:
            argv += [f"--{name}", substitute(str(value), values)]
    return argv


def drain_seconds(preset: EnginePreset, flags: Mapping[str, Any]) -> float:
    """How long SIGTERM may take: the engine's drain flag, else the preset's figure."""
    flag = preset.serve.drain_flag
    if flag and flags.get(flag) is not None:
        try:
            return float(flags[flag])
        except (TypeError, ValueError):
            raise DeployError(f"--{flag} must be a number of seconds (got {flags[flag]!r})") from None
    return float(preset.serve.drain_s or 30)


def flag_source(host: Host, preset: EnginePreset, overrides: Overrides, name: str, value: Any) -> str:
    """Where an engine flag's value comes from, as a refusal names it: --set, the inventory's line, or the preset."""
    if name in overrides.flags:
        return f"--set {name}={value}"
    if name in (host.deploy.get(preset.name) or {}):
        return f"{host.source}: deploy.{preset.name}.{name}={value}"
    return f"the {preset.name} preset's {name}={value}"
