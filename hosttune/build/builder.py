"""`hosttune build` end to end: resolve the source and archs, hit the cache or build, check, file the wheels."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from hosttune.build import archcheck
from hosttune.build.archs import archs_of, compute_name, sort_archs
from hosttune.build.errors import ArchCheckError, BuildError
from hosttune.build.plan import BuildCommand, BuildOptions, BuildPlan, package_dir, plan_build, plan_deps
from hosttune.build.runner import run_commands
from hosttune.build.source import Source, resolve_custom, resolve_git
from hosttune.build.toolchain import Toolchain, find_cuobjdump, read_toolchain
from hosttune.build.wheelhouse import Entry, WheelKey, describe_wheels, lookup, write_manifest
from hosttune.errors import HosttuneError
from hosttune.fleet import probe
from hosttune.fleet_runner import DEFAULT_FORKS, FleetRunner
from hosttune.config.inventory import Inventory
from hosttune.presets import EnginePreset, load_preset


@dataclass(frozen=True)
class BuildRequest:
    engine: str
    wheelhouse: Path
    archs: tuple[str, ...] = ()  # the CUDA archs to build for (resolved from the fleet by the caller for auto)
    ref: str | None = None
    source: str | None = None  # a git URL or path; default: the preset's
    python: str | None = None  # the interpreter the wheels are built for; default: this one
    deps: bool = False  # also download dependency wheels into the entry
    cuobjdump: str | None = None
    options: BuildOptions = field(default_factory=BuildOptions)


@dataclass(frozen=True)
class BuildResult:
    entry: Entry
    cache_hit: bool
    plan: BuildPlan
    log: Path | None  # None on a cache hit
    build_s: float = 0.0


def fleet_archs(inventory: Inventory, forks: int = DEFAULT_FORKS) -> tuple[str, ...]:
    """--arch auto: the compute capabilities of the GPUs the inventory's hosts report (one probe each)."""
    def one(host):
        try:
            return probe(host)[0]
        except HosttuneError as exc:
            raise BuildError(f"--arch auto: cannot read the GPUs of {host.name} ({exc}); pass the archs with --arch, "
                             "or --limit the hosts that answer") from None

    archs = archs_of(FleetRunner(forks).map(one, list(inventory.hosts)))
    if not archs:
        raise BuildError(f"--arch auto: no host in {inventory.source} reported a GPU with a compute capability; "
                         "pass the archs explicitly, e.g. --arch 8.0,9.0")
    return archs


def resolve_source(preset: EnginePreset, request: BuildRequest) -> Source:
    if preset.is_bundled:
        if request.source:
            raise BuildError("--source: the custom engine is built from this checkout's engine/ folder (use --ref for a commit)")
        return resolve_custom(request.ref)
    ref = request.ref or preset.build.ref
    if not ref:
        raise BuildError(f"--ref: {preset.name} is built from a pinned ref; name a tag, branch or commit")
    return resolve_git(request.source or preset.build.source, ref)


def check_build_python(preset: EnginePreset, toolchain: Toolchain, options: BuildOptions) -> None:
    """Without build isolation a native engine builds against the build Python's torch (its setup imports it)."""
    if options.build_isolation or preset.is_bundled or toolchain.has_torch:
        return
    raise BuildError(f"--no-build-isolation builds {preset.name} against {toolchain.python}'s own packages, and it has "
                     f"no torch, which the build imports; install the torch {preset.name} is built for into it, or "
                     "leave --no-build-isolation out")


def check_nvcc_supports(toolchain: Toolchain, archs: tuple[str, ...]) -> None:
    if not toolchain.nvcc_archs:
        return
    unsupported = [a for a in archs if compute_name(a) not in {compute_name(x) for x in toolchain.nvcc_archs}
                   and compute_name(a.rstrip("af")) not in {compute_name(x) for x in toolchain.nvcc_archs}]
    if unsupported:
        raise BuildError(f"nvcc {toolchain.cuda_version} ({toolchain.nvcc}) cannot compile for {', '.join(unsupported)}; "
                         f"it supports {', '.join(toolchain.nvcc_archs)}. Use the CUDA toolkit the fleet is pinned to.")


def make_key(preset: EnginePreset, source: Source, archs: tuple[str, ...], toolchain: Toolchain) -> WheelKey:
    if preset.is_bundled:  # pure Python: Triton compiles for the host's GPU at run time
        return WheelKey(preset.name, source.label, (), None, toolchain.python_abi)
    if not archs:
        raise BuildError(f"--arch: {preset.name} compiles CUDA kernels; name the archs (8.0,9.0) or use auto with an inventory")
    if not toolchain.cuda_version:
        raise BuildError(f"cannot tell the CUDA version of {toolchain.nvcc} (nvcc --version)")
    return WheelKey(preset.name, source.label, sort_archs(archs), toolchain.cuda_version, toolchain.python_abi)


def plan(request: BuildRequest) -> tuple[BuildPlan, Toolchain]:
    """Everything decided, nothing built: the plan a dry run prints."""
    preset = load_preset(request.engine)
    toolchain = read_toolchain(request.python, need_cuda=not preset.is_bundled)
    check_build_python(preset, toolchain, request.options)
    source = resolve_source(preset, request)
    key = make_key(preset, source, request.archs, toolchain)
    check_nvcc_supports(toolchain, key.archs)
    tag = f"{key.name}-{os.getpid()}"
    build_plan = plan_build(preset, source, key, toolchain, request.wheelhouse / f".work-{tag}",
                            request.wheelhouse / f".staging-{tag}", request.options)
    return build_plan, toolchain


def cached(request: BuildRequest, build_plan: BuildPlan) -> Entry | None:
    """The entry a build of this plan reuses: complete, intact, with dependency wheels when --deps asks for them."""
    hit = lookup(request.wheelhouse, build_plan.key)
    return hit if hit is not None and (hit.has_deps or not request.deps) else None


def preview(request: BuildRequest) -> str:
    """What a real build would do, for --dry-run: reuse the cached entry, or run the plan (then download the
    dependency wheels with --deps)."""
    build_plan, toolchain = plan(request)
    hit = cached(request, build_plan)
    if hit is not None:
        return f"cache hit: {hit.key.name}, nothing to build\n  {hit.path}"
    check_writable(request.wheelhouse)  # the build's own check, before its first step
    cuobjdump = find_cuobjdump(toolchain, request.cuobjdump) if build_plan.key.archs else None
    text = build_plan.render()
    if request.deps:
        deps = plan_deps([], build_plan.staging, toolchain, request.options)
        text += f"\n  {len(build_plan.commands) + 1}. {deps.description}\n     {deps.render()} <the wheels built above>"
    if cuobjdump:
        text += (f"\n  then {cuobjdump} checks that every native library carries machine code for "
                 f"{', '.join(build_plan.key.archs)}; one that does not fails the build")
    return text + f"\n  filed as {request.wheelhouse / build_plan.key.name} (build log under {request.wheelhouse / 'logs'})"


def _unwritable(wheelhouse: Path, why: str) -> BuildError:
    return BuildError(f"cannot write to the wheelhouse {wheelhouse} ({why}); pass --wheelhouse a folder you can write")


def check_writable(wheelhouse: Path) -> None:
    """The wheelhouse takes new folders (the log, the staging entry): one is made and removed again in its
    nearest existing folder, the one the build will make the wheelhouse in. A build checks this before any
    step runs and a dry run before it prints the plan, so the plan never promises a wheelhouse the build
    refuses; nothing is left behind. Only making a folder tells: permission bits say yes to root on /proc."""
    existing = wheelhouse
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".writable-", dir=existing))
    except OSError as exc:
        raise _unwritable(wheelhouse, exc.strerror or str(exc)) from None


def _make_wheelhouse(wheelhouse: Path) -> None:
    try:
        wheelhouse.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(wheelhouse, exc.strerror or str(exc)) from None


def build(request: BuildRequest, on_step: Callable[[BuildCommand], None] | None = None) -> BuildResult:
    """The entry for the request's key: from the cache, or built, checked and filed."""
    build_plan, toolchain = plan(request)
    hit = cached(request, build_plan)
    if hit is not None:
        return BuildResult(hit, True, build_plan, None)
    check_writable(request.wheelhouse)
    _make_wheelhouse(request.wheelhouse)
    cuobjdump = find_cuobjdump(toolchain, request.cuobjdump) if build_plan.key.archs else None
    log = request.wheelhouse / "logs" / f"{build_plan.key.name}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    start = time.monotonic()
    try:
        run_commands(build_plan.commands, log, on_step)
        try:
            cuda_archs = _collect_wheels(build_plan, cuobjdump)
        except ArchCheckError as exc:
            raise ArchCheckError(f"{exc}\nbuild log: {log}") from None
        if request.deps:
            _download_deps(build_plan, toolchain, request.options, log, on_step)
        entry = _file_entry(request, build_plan, toolchain, cuda_archs, log, time.monotonic() - start)
    finally:
        shutil.rmtree(build_plan.work, ignore_errors=True)
        shutil.rmtree(build_plan.staging, ignore_errors=True)
    return BuildResult(entry, False, build_plan, log, time.monotonic() - start)


def _collect_wheels(build_plan: BuildPlan, cuobjdump: str | None) -> dict[str, dict[str, tuple[str, ...]]]:
    """Check each native package's wheel, then gather all wheels in staging/wheels; {wheel: {library: sms}}."""
    wheels_dir = build_plan.staging / "wheels"
    wheels_dir.mkdir()
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for index, package in enumerate(build_plan.packages):
        wheels = sorted(package_dir(build_plan.staging, index).glob("*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"pip wheel {package.path} produced {len(wheels)} wheels, expected one")
        if package.native and build_plan.key.archs:
            found[wheels[0].name] = archcheck.check_wheel(cuobjdump, wheels[0], build_plan.key.archs)
        wheels[0].rename(wheels_dir / wheels[0].name)
    return found


def _download_deps(build_plan: BuildPlan, toolchain: Toolchain, options: BuildOptions, log: Path, on_step) -> None:
    wheels = sorted((build_plan.staging / "wheels").glob("*.whl"))
    run_commands([plan_deps(wheels, build_plan.staging, toolchain, options)], log, on_step)
    for wheel in wheels:  # pip download copies the wheels it was given too
        (build_plan.staging / "deps" / wheel.name).unlink(missing_ok=True)


def _file_entry(request: BuildRequest, build_plan: BuildPlan, toolchain: Toolchain,
                cuda_archs: dict, log: Path, build_s: float) -> Entry:
    staging = build_plan.staging
    shutil.copyfile(log, staging / "build.log")
    wheels = describe_wheels(staging / "wheels", "engine", cuda_archs)
    if (staging / "deps").is_dir():
        wheels += describe_wheels(staging / "deps", "dep")
    for index in range(len(build_plan.packages)):
        package_dir(staging, index).rmdir()
    tools = {"python": toolchain.python, "nvcc": toolchain.nvcc, "max_jobs": toolchain.max_jobs}
    target = request.wheelhouse / build_plan.key.name
    entry = Entry(target, build_plan.key, tuple(wheels), build_plan.source.location, build_plan.source.commit,
                  time.time(), round(build_s, 1), tools)
    write_manifest(replace(entry, path=staging))
    if target.exists():  # an incomplete or damaged entry of the same key
        shutil.rmtree(target)
    staging.rename(target)
    return entry
