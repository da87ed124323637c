"""A build as data: the commands (argv + environment + folder) that turn a source into wheels.

Planning reads nothing and runs nothing; `runner.run_plan` is the one place that executes
commands. So a dry run prints exactly what a real build runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hosttune.build.archs import cmake_cuda_architectures, torch_cuda_arch_list
from hosttune.build.source import Source, is_local_repo
from hosttune.build.toolchain import Toolchain
from hosttune.build.wheelhouse import WheelKey
from hosttune.presets import EnginePreset, Package, substitute
from hosttune.quoting import join, quote


@dataclass(frozen=True)
class BuildCommand:
    description: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)  # added to the build machine's environment
    path_prepend: tuple[str, ...] = ()  # folders put in front of the machine's PATH

    def render(self) -> str:
        env = [f"{k}={quote(v)}" for k, v in sorted(self.env.items())]
        if self.path_prepend:
            env.append("PATH=" + ":".join(map(quote, self.path_prepend)) + ":$PATH")
        return " ".join(env + [join(self.argv)])


@dataclass(frozen=True)
class BuildPlan:
    key: WheelKey
    source: Source
    work: Path  # scratch: the checkout
    staging: Path  # becomes the wheelhouse entry once everything passed
    commands: tuple[BuildCommand, ...]
    packages: tuple[Package, ...]  # in the order of their package-N folders; native ones are arch-checked

    def render(self) -> str:
        lines = [f"build {self.key.name}", f"  source {self.source.location} @ {self.source.ref}"
                 + (f" ({self.source.commit})" if self.source.commit else "")]
        lines += [f"  {i}. {c.description}\n     {c.render()}" for i, c in enumerate(self.commands, 1)]
        return "\n".join(lines)


@dataclass(frozen=True)
class BuildOptions:
    build_isolation: bool = True  # False: build against the build Python's own torch (pip --no-build-isolation)
    constraints: str | None = None  # a pip constraints file for the dependency download


def build_env(preset: EnginePreset, key: WheelKey, toolchain: Toolchain) -> dict[str, str]:
    """The environment every compile step sees: the arch list, the CUDA toolkit, the job count."""
    jobs = str(toolchain.max_jobs)
    env = {substitute(k, {}): substitute(v, {"max_jobs": jobs}) for k, v in preset.build.env.items()}
    env["MAX_JOBS"] = jobs
    if key.archs:
        env["TORCH_CUDA_ARCH_LIST"] = torch_cuda_arch_list(key.archs)
        env["CMAKE_CUDA_ARCHITECTURES"] = cmake_cuda_architectures(key.archs)
    if toolchain.cuda_home:
        env["CUDA_HOME"] = toolchain.cuda_home
    return env


def checkout_commands(preset: EnginePreset, source: Source, work: Path) -> list[BuildCommand]:
    """A fresh checkout of exactly the resolved commit (never a tree with local changes)."""
    src = str(work / "src")
    if source.commit is None:
        return []
    if preset.is_bundled:  # the bundled engine at a ref: engine/ of that commit of this repository
        archive = str(work / "engine.tar")
        return [BuildCommand("export engine/ at the ref",
                             ("git", "-C", source.location, "archive", "--format=tar", "-o", archive, source.commit, "engine")),
                BuildCommand("unpack it", ("tar", "-xf", archive, "-C", src))]
    clone = ("git", "clone", "--no-checkout", "--quiet")
    if not is_local_repo(source.location):
        clone += ("--filter=blob:none",)  # fetch file contents of the one commit only
    return [
        BuildCommand("clone the source", (*clone, source.location, src)),
        BuildCommand(f"check out {source.ref}", ("git", "-C", src, "checkout", "--quiet", "--detach", source.commit)),
        BuildCommand("submodules", ("git", "-C", src, "submodule", "update", "--init", "--recursive", "--quiet")),
    ]


def package_dir(staging: Path, index: int) -> Path:
    """Where the wheel of the preset's index-th package lands (one folder each, to tell them apart)."""
    return staging / f"package-{index}"


def wheel_command(package: Package, index: int, tree: Path, staging: Path, toolchain: Toolchain,
                  env: dict[str, str], options: BuildOptions) -> BuildCommand:
    argv = (toolchain.python, "-m", "pip", "wheel", "--verbose", "--no-deps", "--wheel-dir", str(package_dir(staging, index)))
    if not options.build_isolation:
        argv += ("--no-build-isolation",)
    folder = tree if package.path == "." else tree / package.path
    cuda_bin = (f"{toolchain.cuda_home}/bin",) if toolchain.cuda_home else ()
    return BuildCommand(f"pip wheel {package.path}", (*argv, str(folder)), env, cuda_bin)


def plan_build(preset: EnginePreset, source: Source, key: WheelKey, toolchain: Toolchain, work: Path,
               staging: Path, options: BuildOptions = BuildOptions()) -> BuildPlan:
    commands = [BuildCommand("scratch folders", ("mkdir", "-p", str(work / "src"), str(staging)))]
    commands += checkout_commands(preset, source, work)
    if source.commit is None:
        tree = Path(source.location)  # the bundled engine as it is in this checkout
    elif preset.is_bundled:
        tree = work / "src" / "engine"
    else:
        tree = work / "src"
    env = build_env(preset, key, toolchain)
    commands += [wheel_command(p, i, tree, staging, toolchain, env, options) for i, p in enumerate(preset.build.packages)]
    return BuildPlan(key, source, work, staging, tuple(commands), preset.build.packages)


def plan_deps(wheels: list[Path], staging: Path, toolchain: Toolchain, options: BuildOptions) -> BuildCommand:
    """Download the dependencies of the built wheels (binary only), for hosts without a package index."""
    argv = (toolchain.python, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(staging / "deps"))
    if options.constraints:
        argv += ("--constraint", options.constraints)
    return BuildCommand("download dependency wheels", (*argv, *map(str, wheels)))
