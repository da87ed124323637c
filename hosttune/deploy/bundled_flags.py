"""The bundled engine's flags, checked before any host is contacted: every engine flag the inventory's
`deploy: {custom: ...}` or `--set` gives is parsed by the `serve` options of this checkout's engine/
(hosttune_engine/server/options.py). An unknown flag, or a value the engine refuses (a choice it
does not have, a number it does not take), stops the run in one line naming where it was set.

The options module runs in a child interpreter with engine/ on its path: it imports neither torch
nor any other engine dependency, and the control plane imports nothing of the engine. Each host
still checks every flag against its installed release (flagcheck.py): a release built from another
ref may differ from this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from hosttune.build.errors import BuildError
from hosttune.build.source import engine_folder
from hosttune.config.inventory import Host, Inventory
from hosttune.deploy.errors import DeployError
from hosttune.deploy.settings import Overrides, flag_argv
from hosttune.presets import ENGINES, EnginePreset, load_preset

OPTIONS_MODULE = "hosttune_engine.server.options"
CHECK_TIMEOUT_S = 60.0


class EngineFlagError(DeployError):
    """An engine flag, or its value, that the bundled engine's `serve` refuses."""


@dataclass(frozen=True)
class GivenFlag:
    """One engine flag as the user gave it: where, and the argv the service would get."""

    where: str
    name: str
    argv: tuple[str, ...]


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _given(where: str, name: str, value: Any, preset: EnginePreset) -> GivenFlag | None:
    name = str(name).removeprefix("--")
    if value is None or "{" in str(value):  # left out, or a placeholder only the host fills in: the host checks it
        return None
    argv = tuple(flag_argv({name: value}, {}, preset.serve.false_flag))
    return GivenFlag(where, name, argv) if argv else None  # false without a negation: left out as well


def _bundled_preset(host: Host, engine: str | None) -> EnginePreset | None:
    name = engine or host.deploy.get("engine")
    preset = load_preset(name) if name in ENGINES else None
    return preset if preset and preset.is_bundled else None


def given_flags(inventory: Inventory, engine: str | None, overrides: Overrides) -> list[GivenFlag]:
    """The flags set for the bundled engine: --set first, then each host's inventory flags --set does not override."""
    presets = {h.name: p for h in inventory.hosts if (p := _bundled_preset(h, engine))}
    if not presets:
        return []
    preset = next(iter(presets.values()))
    flags = [_given(f"--set {n}={_shown(v)}", n, v, preset) for n, v in overrides.flags.items()]
    for host in (h for h in inventory.hosts if h.name in presets):
        own = host.deploy.get(preset.name)
        for name, value in (own.items() if isinstance(own, dict) else ()):
            if str(name).removeprefix("--") not in overrides.flags:
                flags.append(_given(f"{host.source}: deploy.{preset.name}.{name}={_shown(value)}", name, value, preset))
    return [f for f in flags if f]


def refusals(argvs: list[tuple[str, ...]]) -> list[str | None]:
    """argparse's reason per argv (None: taken), from the options of this checkout's engine/."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(engine_folder()), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        result = subprocess.run([sys.executable, "-m", OPTIONS_MODULE, json.dumps(argvs)], capture_output=True,
                                text=True, env=env, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DeployError(f"checking the bundled engine's flags took over {CHECK_TIMEOUT_S:.0f} s") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]  # a traceback's error line
        raise DeployError(f"checking the bundled engine's flags failed: {last[-300:]}")
    return json.loads(result.stdout)


def _message(flag: GivenFlag, reason: str) -> str:
    unrecognized = reason.removeprefix("unrecognized arguments: ")
    if unrecognized != reason and unrecognized.startswith(f"--{flag.name}"):
        return (f"{flag.where}: the bundled engine's serve has no --{flag.name} "
                f"(engine/hosttune_engine/server/options.py); fix its name or drop it")
    if unrecognized != reason:
        return f"{flag.where}: the bundled engine's --{flag.name} takes no value: give true or false"
    return f"{flag.where}: the bundled engine refuses it: {reason}"


def check_bundled_flags(inventory: Inventory, engine: str | None, overrides: Overrides, ref: str | None) -> str | None:
    """Raises EngineFlagError for the first flag the bundled engine refuses; returns what a plan says of the check
    (None: not checked here, as for vLLM, SGLang, a release of another --ref or a hosttune without engine/)."""
    if ref is not None or not any(_bundled_preset(h, engine) for h in inventory.hosts):
        return None
    try:
        folder = engine_folder()
    except BuildError:
        return None
    flags = given_flags(inventory, engine, overrides)
    for flag, reason in zip(flags, refusals([f.argv for f in flags]) if flags else []):
        if reason:
            raise EngineFlagError(_message(flag, reason))
    return (f"bundled engine flags: checked against {folder}/hosttune_engine/server/options.py before any host; "
            f"on each host against the installed release's `serve --help` (before anything live changes)")
