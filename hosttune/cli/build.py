"""`hosttune build`: engine wheels for the fleet's GPU architectures, into a keyed wheelhouse."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from hosttune.build import builder
from hosttune.build.archs import parse_arch_list
from hosttune.build.errors import BuildError
from hosttune.build.plan import BuildOptions
from hosttune.build.wheelhouse import default_wheelhouse
from hosttune.cli.app import app
from hosttune.cli.common import AcceptKeysOpt, InventoryOpt, LimitOpt, load, path_option, text_option, user_errors
from hosttune.cli.progress import Progress


class Engine(str, Enum):
    custom = "custom"
    vllm = "vllm"
    sglang = "sglang"


WheelhouseOpt = path_option(None, "--wheelhouse", "-w", help="Wheelhouse folder (default: ~/.cache/hosttune/wheelhouse).")


@app.command()
@user_errors
def build(
    engine: Engine = typer.Option(..., "--engine", "-e", help="custom (engine/ of this checkout), vllm or sglang."),
    ref: Optional[str] = text_option(None, "--ref", help="Tag, branch or commit to build (default: the preset's pin; custom: the working tree)."),
    source: Optional[str] = text_option(None, "--source", help="Source repository, a path or git URL (default: the preset's)."),
    arch: str = typer.Option("auto", "--arch", help="CUDA archs, e.g. 8.0,9.0; auto: the GPUs the inventory's hosts report (vllm, sglang; custom is pure Python: Triton compiles on the host)."),
    wheelhouse: Optional[Path] = WheelhouseOpt,
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
    python: Optional[str] = text_option(None, "--python", help="Build for this interpreter (default: the one running hosttune)."),
    deps: bool = typer.Option(False, "--deps", help="Also download the dependency wheels, for hosts without a package index."),
    constraint: Optional[Path] = typer.Option(None, "--constraint", "-c", exists=True, dir_okay=False, help="pip constraints for the dependency download (with --deps)."),
    build_isolation: bool = typer.Option(True, "--build-isolation/--no-build-isolation", help="Build against pip's isolated build requirements (default) or the build Python's own packages."),
    cuobjdump: Optional[str] = text_option(None, "--cuobjdump", help="The cuobjdump that checks the machine code (default: PATH, CUDA, then Triton's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the build plan (commands and environment), or the cached entry a build would reuse, and build nothing."),
) -> None:
    """Build an engine's wheels for the fleet's GPUs; a second build with the same key is a cache hit.

    The key is (engine, ref, archs, CUDA version, Python ABI). Native libraries are checked
    with cuobjdump to carry machine code for every arch; the build fails if one does not.

    Example: hosttune build --engine vllm --ref v0.11.0 --arch auto -i inventories/example.yaml
    """
    if constraint and not deps:
        raise BuildError("--constraint constrains the dependency download: give --deps too")
    archs = _archs(engine, arch, inventory, limit, accept_new_host_keys, cuobjdump)
    request = builder.BuildRequest(
        engine.value, wheelhouse or default_wheelhouse(), archs, ref, source, python, deps, cuobjdump,
        BuildOptions(build_isolation, str(constraint) if constraint else None))
    if dry_run:
        typer.echo(builder.preview(request))
        return
    with Progress(f"building {engine.value}", unit="steps") as progress:
        result = builder.build(request, on_step=lambda command: _step(progress, command))
    typer.echo(_summary(result))


def _archs(engine: Engine, arch: str, inventory: Optional[Path], limit: Optional[str], accept: bool,
           cuobjdump: Optional[str] = None) -> tuple[str, ...]:
    """The archs to build for: --arch, or auto from the inventory's GPUs. The custom engine has none, so options
    that choose them, or check its machine code, are an error there rather than silently ignored."""
    if engine is Engine.custom:
        given = [name for name, value in (("--arch", arch != "auto"), ("--inventory", inventory), ("--limit", limit),
                                          ("--cuobjdump", cuobjdump)) if value]
        if given:
            raise BuildError(f"{', '.join(given)}: the custom engine is pure Python (Triton compiles for each host's GPU "
                             "when it starts), so it has no archs to choose or machine code to check; leave them out")
        return ()
    return builder.fleet_archs(load(inventory, limit, accept)) if arch == "auto" else parse_arch_list(arch)


def _step(progress: Progress, command) -> None:
    """A build step starts: its line on stderr, and the bar shows it as the current one."""
    progress.note(f"- {command.description}")
    progress.update(progress.num_done + 1, status=command.description)


def _summary(result: builder.BuildResult) -> str:
    entry = result.entry
    head = (f"cache hit: {entry.key.name}" if result.cache_hit
            else f"built {entry.key.name} in {result.build_s:.1f}s (log: {entry.path / 'build.log'})")
    lines = [head, f"  {entry.path}"]
    for wheel in entry.wheels:
        if wheel.kind != "engine":
            continue
        archs = sorted({sm for sms in wheel.cuda_archs.values() for sm in sms})
        lines.append(f"  {wheel.name}" + (f"  [{', '.join(archs)} in {len(wheel.cuda_archs)} libraries]" if archs else ""))
    num_deps = sum(1 for w in entry.wheels if w.kind == "dep")
    if num_deps:
        lines.append(f"  + {num_deps} dependency wheels")
    return "\n".join(lines)
