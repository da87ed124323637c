"""A real CUDA extension built from source with nvcc for 8.0 and 9.0 through
`hosttune build` (the vLLM code path: git checkout at a ref, pip wheel --no-deps,
TORCH_CUDA_ARCH_LIST), its machine code checked with cuobjdump; an artefact missing an
arch fails the check; the second build with the same key is a cache hit.

The fixture package (tests/fixtures/cuda_ext) stands in for vLLM's source tree. Needs nvcc
(skipped without one) and a cuobjdump (the CUDA toolkit's, or the one in Triton's wheel).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.build import archcheck
from hosttune.build.errors import ArchCheckError, BuildError
from hosttune.build.toolchain import find_cuobjdump, find_nvcc, read_toolchain
from hosttune.cli import app

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_ext"
TRITON_CUOBJDUMP = "triton/backends/nvidia/bin/cuobjdump"
runner = CliRunner()

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit needed to compile the fixture)")


@pytest.fixture(scope="module")
def cuobjdump(tmp_path_factory) -> str:
    """The build machine's cuobjdump; else the one inside Triton's wheel (pip finds it in its cache or index)."""
    try:
        return find_cuobjdump(read_toolchain(need_cuda=False))
    except BuildError:
        pass
    folder = tmp_path_factory.mktemp("triton-wheel")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "triton",
                    "-d", str(folder)], check=True, timeout=900)
    (wheel,) = folder.glob("triton-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        path = Path(zf.extract(TRITON_CUOBJDUMP, folder))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    wheel.unlink()
    return str(path)


@pytest.fixture
def ext_repo(tmp_path) -> Path:
    return _ext_repo(tmp_path)


def _ext_repo(folder: Path) -> Path:
    """The fixture package as a git repository with a tag, like an engine's source at a pinned ref."""
    repo = folder / "cuda_ext"
    shutil.copytree(FIXTURE, repo, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fixture"], check=True)
    subprocess.run([*git, "tag", "v0.1.0"], check=True)
    return repo


def build(repo: Path, wheelhouse: Path, cuobjdump: str, archs: str = "8.0,9.0", env: dict | None = None, *extra: str):
    argv = ["build", "--engine", "vllm", "--source", str(repo), "--ref", "v0.1.0", "--arch", archs,
            "--wheelhouse", str(wheelhouse), "--cuobjdump", cuobjdump, *extra]
    return runner.invoke(app, argv, env=env)


@pytest.fixture(scope="module")
def two_arch_build(tmp_path_factory, cuobjdump):
    """One build for 8.0 and 9.0 (nvcc through pip wheel, the slow part): the source, the wheelhouse, the result.
    The tests that read it build nothing new into its wheelhouse (a cache hit at most)."""
    folder = tmp_path_factory.mktemp("two-arch")
    repo, wheelhouse = _ext_repo(folder), folder / "wheelhouse"
    return repo, wheelhouse, build(repo, wheelhouse, cuobjdump)


def test_two_arch_build_passes_the_check_and_is_cached(two_arch_build, cuobjdump):
    ext_repo, wheelhouse, first = two_arch_build
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("built vllm-v0.1.0-") and "-sm_80.sm_90-cu" in first.stdout
    assert "[sm_80, sm_90 in 1 libraries]" in first.stdout
    (entry,) = [p for p in wheelhouse.iterdir() if p.name.startswith("vllm-")]
    (wheel,) = (entry / "wheels").glob("cuda_ext-0.1.0-*.whl")
    assert archcheck.check_wheel(cuobjdump, wheel, ("8.0", "9.0")) == {"cuda_ext/_add_one.so": ("sm_80", "sm_90")}
    log = (entry / "build.log").read_text()
    assert "TORCH_CUDA_ARCH_LIST='8.0;9.0'" in log and "code=sm_90" in log  # nvcc saw both archs

    again = build(ext_repo, wheelhouse, cuobjdump, archs="9.0,8.0")  # same key, other spelling
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("cache hit: vllm-v0.1.0-")
    assert "clone the source" not in again.output
    assert len(list((wheelhouse / "logs").iterdir())) == 1  # nothing was built the second time


def test_artefact_without_one_arch_fails_the_check(two_arch_build, tmp_path, cuobjdump):
    _, wheelhouse, built = two_arch_build
    assert built.exit_code == 0, built.output
    (wheel,) = wheelhouse.glob("vllm-*/wheels/*.whl")
    # The same library with its sm_90 machine code removed: recompiled for sm_80 only, swapped into a copy of the wheel.
    lib = tmp_path / "_add_one.so"
    subprocess.run([find_nvcc(), "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_80,code=sm_80",
                    "-o", str(lib), str(FIXTURE / "csrc" / "add_one.cu")], check=True)
    pruned = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(pruned, "w") as dst:
        for item in src.infolist():
            data = lib.read_bytes() if item.filename == "cuda_ext/_add_one.so" else src.read(item)
            dst.writestr(item, data)
    with pytest.raises(ArchCheckError, match=r"cuda_ext/_add_one.so: has sm_80; missing sm_90"):
        archcheck.check_wheel(cuobjdump, pruned, ("8.0", "9.0"))
    assert archcheck.check_wheel(cuobjdump, pruned, ("8.0",)) == {"cuda_ext/_add_one.so": ("sm_80",)}


def test_build_that_drops_an_arch_fails_loudly_and_files_nothing(ext_repo, tmp_path, cuobjdump):
    wheelhouse = tmp_path / "wheelhouse"
    result = build(ext_repo, wheelhouse, cuobjdump, env={**os.environ, "CUDA_EXT_IGNORE_ARCH": "9.0"})
    assert result.exit_code == 2
    assert "machine code missing for requested architectures" in result.output
    assert "cuda_ext/_add_one.so: has sm_80; missing sm_90" in result.output
    assert [p.name for p in wheelhouse.iterdir()] == ["logs"]  # no entry, no staging left; the log is kept
    assert "build log:" in result.output


def test_failing_build_shows_the_last_lines_of_its_log(ext_repo, tmp_path, cuobjdump):
    (ext_repo / "csrc" / "add_one.cu").write_text("this is not CUDA\n")
    git = ["git", "-C", str(ext_repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "commit", "-qam", "break it"], check=True)
    subprocess.run([*git, "tag", "-f", "v0.1.0"], check=True, capture_output=True)
    result = build(ext_repo, tmp_path / "wheelhouse", cuobjdump)
    assert result.exit_code == 2
    assert "build step 'pip wheel .' failed" in result.output
    assert "--- last lines of the log ---" in result.output and "add_one.cu" in result.output
    (log,) = (tmp_path / "wheelhouse" / "logs").iterdir()
    assert "this declaration has no storage class" in log.read_text() or "error" in log.read_text()


def test_dry_run_names_the_arch_check_and_fails_as_the_build_would_without_cuobjdump(ext_repo, tmp_path, cuobjdump):
    wheelhouse = tmp_path / "wheelhouse"
    plan = build(ext_repo, wheelhouse, cuobjdump, "8.0,9.0", None, "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert f"then {cuobjdump} checks that every native library carries machine code for 8.0, 9.0" in plan.stdout
    assert not wheelhouse.exists()
    for extra in ((), ("--dry-run",)):
        missing = build(ext_repo, wheelhouse, str(tmp_path / "none"), "8.0,9.0", None, *extra)
        assert missing.exit_code == 2 and f"--cuobjdump {tmp_path / 'none'}: not an executable file" in missing.output
