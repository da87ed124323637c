"""Build planning as data: archs, keys, environment, commands, cuobjdump and git output parsing."""


import pytest
from typer.testing import CliRunner

from hosttune.build.archcheck import LibraryArchs, missing_archs, parse_list_elf
from hosttune.build.archs import archs_of, cmake_cuda_architectures, parse_arch_list, sm_name, torch_cuda_arch_list
from hosttune.build import builder
from hosttune.build.builder import make_key
from hosttune.build.errors import BuildError
from hosttune.build.plan import BuildOptions, plan_build
from hosttune.build.source import Source, parse_ls_remote, resolve_git
from hosttune.build.toolchain import Toolchain, cuda_home_of, parse_gpu_archs, parse_nvcc_version
from hosttune.build.wheelhouse import WheelKey
from hosttune.cli import app
from hosttune.probes.facts import Facts, GpuFacts, GpuInfo
from hosttune.presets import load_preset

GIB = 2**30
TOOLS = Toolchain("/usr/bin/python3", "cp311", (), cpu_count=64, mem_total_bytes=256 * GIB,
                  nvcc="/usr/local/cuda-12.4/bin/nvcc", cuda_version="12.4", cuda_home="/usr/local/cuda-12.4",
                  nvcc_archs=("5.0", "7.5", "8.0", "9.0"))


def test_arch_lists_parse_sort_and_convert():
    assert parse_arch_list("9.0, 8.0;8.0") == ("8.0", "9.0")
    assert parse_arch_list("9.0a") == ("9.0a",) and sm_name("9.0a") == "sm_90a"
    assert torch_cuda_arch_list(("8.0", "9.0")) == "8.0;9.0"
    assert cmake_cuda_architectures(("8.0", "9.0a")) == "80;90a"
    for bad in ("sm_80", "8", "eight", ""):
        with pytest.raises(BuildError):
            parse_arch_list(bad)
    for gap in ("8.0,,9.0", "8.0, ;9.0", ",8.0", "9.0,"):
        with pytest.raises(BuildError, match=f"^--arch {gap!r} has an empty entry; list archs such as 8.0,9.0$"):
            parse_arch_list(gap)


def test_cli_an_empty_arch_entry_is_refused_naming_the_value(tmp_path):
    result = CliRunner().invoke(app, ["build", "--engine", "vllm", "--arch", "8.0,,9.0", "-w", str(tmp_path), "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr == "hosttune: --arch '8.0,,9.0' has an empty entry; list archs such as 8.0,9.0\n"


def test_archs_of_fleet_facts():
    a100 = Facts(gpu=GpuFacts(gpus=(GpuInfo(0, "A100", "0000:01:00.0", compute_cap="8.0"),)))
    h200 = Facts(gpu=GpuFacts(gpus=(GpuInfo(0, "H200", "0000:02:00.0", compute_cap="9.0"),) * 2))
    assert archs_of([h200, a100, Facts()]) == ("8.0", "9.0")


def test_max_jobs_follows_memory_then_cpus():
    assert TOOLS.max_jobs == 42  # 256 GiB / 6 GiB per job
    small = Toolchain("py", "cp311", (), cpu_count=64, mem_total_bytes=16 * GIB)
    assert small.max_jobs == 2
    assert Toolchain("py", "cp311", (), cpu_count=2, mem_total_bytes=512 * GIB).max_jobs == 2
    assert Toolchain("py", "cp311", (), cpu_count=8, mem_total_bytes=1 * GIB).max_jobs == 1


def test_nvcc_output_parsers():
    assert parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88") == "13.0"
    assert parse_gpu_archs("compute_75\ncompute_80\ncompute_90\ncompute_100\ncompute_90a") == ("7.5", "8.0", "9.0", "10.0", "9.0a")
    assert cuda_home_of("/nonexistent/bin/nvcc")  # falls back to an installed toolkit or the parent


def test_key_names_every_part():
    key = WheelKey("vllm", "v0.11.0-1a2b3c4d5e6f", ("8.0", "9.0"), "12.4", "cp311")
    assert key.name == "vllm-v0.11.0-1a2b3c4d5e6f-sm_80.sm_90-cu12.4-cp311"
    source = Source("https://example.invalid/vllm.git", "v0.11.0", "1a2b3c4d5e6f" + "0" * 28)
    assert make_key(load_preset("vllm"), source, ("9.0", "8.0"), TOOLS) == key
    custom = make_key(load_preset("custom"), Source("/x/engine", "src.abc", None), ("9.0",), TOOLS)
    assert custom.name == "custom-src.abc-anyarch-anycuda-cp311"  # pure Python: no arch, no CUDA in the key
    with pytest.raises(BuildError, match="--arch"):
        make_key(load_preset("vllm"), source, (), TOOLS)


def test_source_labels():
    sha = "d" * 40
    assert Source("u", "v1.0", sha).label == "v1.0-dddddddddddd"
    assert Source("u", sha, sha).label == "dddddddddddd"
    assert Source("u", "feature/x y", sha).label == "feature_x_y-dddddddddddd"


def test_ls_remote_prefers_the_peeled_tag():
    out = f"{'a' * 40}\trefs/tags/v1\n{'b' * 40}\trefs/tags/v1^{{}}\n{'c' * 40}\trefs/heads/main\n"
    assert parse_ls_remote(out, "v1") == "b" * 40
    assert parse_ls_remote(out, "main") == "c" * 40
    assert parse_ls_remote(out, "v2") is None


def test_vllm_plan_is_data(tmp_path):
    source = Source("https://github.com/vllm-project/vllm.git", "v0.11.0", "f" * 40)
    key = make_key(load_preset("vllm"), source, ("8.0", "9.0"), TOOLS)
    plan = plan_build(load_preset("vllm"), source, key, TOOLS, tmp_path / "work", tmp_path / "staging",
                      BuildOptions(build_isolation=False))
    argvs = [c.argv for c in plan.commands]
    assert argvs[1][:2] == ("git", "clone") and "--filter=blob:none" in argvs[1]
    assert argvs[2][-1] == "f" * 40
    wheel = plan.commands[-1]
    assert wheel.argv[:7] == ("/usr/bin/python3", "-m", "pip", "wheel", "--verbose", "--no-deps", "--wheel-dir")
    assert "--no-build-isolation" in wheel.argv and wheel.argv[-1] == str(tmp_path / "work" / "src")
    assert wheel.env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0" and wheel.env["CMAKE_CUDA_ARCHITECTURES"] == "80;90"
    assert wheel.env["MAX_JOBS"] == "42" and wheel.env["CUDA_HOME"] == "/usr/local/cuda-12.4"
    assert wheel.env["VLLM_TARGET_DEVICE"] == "cuda" and wheel.path_prepend == ("/usr/local/cuda-12.4/bin",)
    assert "TORCH_CUDA_ARCH_LIST='8.0;9.0'" in plan.render()


def test_sglang_plan_builds_kernel_then_package(tmp_path):
    source = Source("https://github.com/sgl-project/sglang.git", "v0.5.4", "e" * 40)
    preset = load_preset("sglang")
    plan = plan_build(preset, source, make_key(preset, source, ("9.0",), TOOLS), TOOLS, tmp_path / "w", tmp_path / "s")
    wheels = [c for c in plan.commands if "wheel" in c.argv]
    assert [c.argv[-1] for c in wheels] == [str(tmp_path / "w/src/sgl-kernel"), str(tmp_path / "w/src/python")]
    assert [p.native for p in plan.packages] == [True, False]
    assert wheels[0].env["CMAKE_BUILD_PARALLEL_LEVEL"] == "42"


def test_custom_plan_from_the_working_tree_or_a_ref(tmp_path):
    preset = load_preset("custom")
    here = Source(str(tmp_path / "engine"), "src.abc", None)
    plan = plan_build(preset, here, make_key(preset, here, (), TOOLS), TOOLS, tmp_path / "w", tmp_path / "s")
    assert [c.argv[3] for c in plan.commands[1:]] == ["wheel"] and plan.commands[-1].argv[-1] == str(tmp_path / "engine")
    at_ref = Source(str(tmp_path), "v1", "a" * 40)
    plan = plan_build(preset, at_ref, make_key(preset, at_ref, (), TOOLS), TOOLS, tmp_path / "w", tmp_path / "s")
    assert plan.commands[1].argv[:4] == ("git", "-C", str(tmp_path), "archive") and plan.commands[1].argv[-1] == "engine"
    assert plan.commands[-1].argv[-1] == str(tmp_path / "w/src/engine")


def test_cuobjdump_list_elf_parsing():
    text = "ELF file    1: libk.1.sm_80.cubin\nELF file    2: libk.2.sm_90a.cubin\nELF file    3: libk.3.sm_80.cubin\n"
    assert parse_list_elf(text) == ("sm_80", "sm_90a")


def test_missing_archs_per_library():
    libs = [LibraryArchs("a/_C.so", ("sm_80", "sm_90a")), LibraryArchs("a/_moe.so", ("sm_80",)),
            LibraryArchs("a/host_only.so", ())]
    assert missing_archs(libs, ("8.0", "9.0")) == {"a/_moe.so": ("sm_90",)}


def test_cli_custom_dry_run_prints_the_plan(tmp_path):
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "build custom-src." in result.stdout and "pip wheel --verbose --no-deps" in result.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("extra, named", [(["--arch", "9.0"], "--arch"), (["-i", "/nonexistent.yaml"], "--inventory"),
                                          (["-l", "gpu-*"], "--limit"), (["--cuobjdump", "/bin/true"], "--cuobjdump")])
def test_cli_custom_refuses_the_options_that_choose_archs_instead_of_ignoring_them(tmp_path, extra, named):
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run", *extra])
    assert result.exit_code == 2 and result.output.startswith(f"hosttune: {named}: the custom engine is pure Python")


def test_cli_bad_arch_and_ref_are_user_errors(tmp_path):
    result = CliRunner().invoke(app, ["build", "--engine", "vllm", "--arch", "sm80", "-w", str(tmp_path)])
    assert result.exit_code == 2 and "not a CUDA compute capability" in result.output
    result = CliRunner().invoke(app, ["build", "--engine", "vllm", "--arch", "8.0", "--source", str(tmp_path),
                                      "--ref", "v9", "-w", str(tmp_path)])
    assert result.exit_code == 2 and ("is not a git repository" in result.output or "nvcc not found" in result.output)


def test_cli_dry_run_says_a_cached_entry_is_reused_and_shows_the_dependency_download(tmp_path):
    from deploy_fixtures import fake_entry

    key = builder.plan(builder.BuildRequest("custom", tmp_path))[0].key
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run", "--deps"])
    assert result.exit_code == 0 and "download dependency wheels" in result.stdout  # no entry yet
    fake_entry(tmp_path, "custom", archs=key.archs, cuda=key.cuda, abi=key.python_abi, ref=key.ref)
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run"])
    assert result.exit_code == 0 and result.stdout.startswith(f"cache hit: {key.name}, nothing to build")
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run", "--deps"])
    assert "pip wheel" in result.stdout  # the entry has no dependency wheels: a build with --deps makes a new one


def test_cli_an_unwritable_wheelhouse_is_one_line_before_any_step_and_in_the_dry_run_too(tmp_path):
    (tmp_path / "file").write_text("")
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path / "file" / "wh"), *extra])
        assert result.exit_code == 2 and "internal error" not in result.output
        assert result.output.strip() == (f"hosttune: cannot write to the wheelhouse {tmp_path}/file/wh (Not a directory); "
                                         "pass --wheelhouse a folder you can write")


def test_cli_the_dry_run_refuses_every_wheelhouse_the_build_refuses_with_the_same_line(tmp_path):
    # /proc passes a permission test for root, yet takes no new folder: only making one tells
    for wheelhouse in ("/proc/hosttune-wheelhouse", "/proc/self/hosttune-wheelhouse"):
        outputs = [CliRunner().invoke(app, ["build", "--engine", "custom", "-w", wheelhouse, *extra]).output
                   for extra in ([], ["--dry-run"])]
        assert outputs[0].startswith(f"hosttune: cannot write to the wheelhouse {wheelhouse} (")
        assert outputs[1] == outputs[0]


def test_cli_dry_run_says_where_the_wheels_are_filed_and_makes_nothing(tmp_path):
    wheelhouse = tmp_path / "new" / "wh"
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(wheelhouse), "--dry-run"])
    key = builder.plan(builder.BuildRequest("custom", wheelhouse))[0].key
    assert result.exit_code == 0
    assert result.stdout.rstrip().endswith(f"filed as {wheelhouse / key.name} (build log under {wheelhouse / 'logs'})")
    assert "checks that every native library" not in result.stdout  # custom is pure Python: no arch check
    assert not (tmp_path / "new").exists()


def test_sources_that_cannot_be_read_are_one_line_saying_what_to_give(tmp_path):
    with pytest.raises(BuildError, match=f"^--source {tmp_path} is not a git repository; give a git checkout's path"):
        resolve_git(str(tmp_path), "v1")
    with pytest.raises(BuildError) as unreadable:
        resolve_git(str(tmp_path / "none"), "v1")
    assert "\n" not in str(unreadable.value) and str(unreadable.value).startswith(f"cannot read {tmp_path}/none (fatal: ")
    assert str(unreadable.value).endswith("); give --source a git repository path or URL this machine can reach")


def test_cli_a_constraints_file_must_exist_and_go_with_deps(tmp_path):
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run", "--deps",
                                      "-c", str(tmp_path / "none.txt")], env={"COLUMNS": "250"})
    assert result.exit_code == 2
    assert result.stderr == (f"hosttune build: --constraint: file '{tmp_path}/none.txt' does not exist "
                             "(see hosttune build --help)\n")
    (tmp_path / "c.txt").write_text("torch==2.8.0\n")
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "-w", str(tmp_path), "--dry-run", "-c", str(tmp_path / "c.txt")])
    assert result.exit_code == 2
    assert result.output == "hosttune: --constraint constrains the dependency download: give --deps too\n"


@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo"])
def test_a_python_that_is_not_a_python_interpreter_is_one_line_not_a_crash(tmp_path, program):
    result = CliRunner().invoke(app, ["build", "--engine", "custom", "--python", program, "-w", str(tmp_path), "--dry-run"])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith(f"hosttune: --python {program}: not a Python interpreter (it answered ")


def test_a_python_without_pip_is_refused_before_any_step_and_in_the_dry_run_too(tmp_path):
    """Every build step that makes a wheel is that Python's `pip wheel`: without pip the plan could not run."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    python = str(tmp_path / "bare" / "bin" / "python")
    for dry_run in (["--dry-run"], []):
        result = CliRunner().invoke(app, ["build", "--engine", "custom", "--python", python, "-w", str(tmp_path / "wh"),
                                          *dry_run])
        assert result.exit_code == 2 and result.output == (
            f"hosttune: --python {python}: has no pip, which builds the wheels; install it ({python} -m ensurepip, "
            "or the distribution's python3-pip), or give a Python that has it\n")
    assert not (tmp_path / "wh").exists()


def test_a_build_without_isolation_needs_torch_in_the_build_python(tmp_path):
    """vLLM's and SGLang's builds import torch: --no-build-isolation takes the build Python's own, which must be there."""
    from dataclasses import replace

    alone = BuildOptions(build_isolation=False)
    with pytest.raises(BuildError, match="^--no-build-isolation builds vllm against /usr/bin/python3's own packages, "
                                         "and it has no torch, which the build imports; install the torch vllm is "
                                         "built for into it, or leave --no-build-isolation out$"):
        builder.check_build_python(load_preset("vllm"), TOOLS, alone)
    builder.check_build_python(load_preset("vllm"), replace(TOOLS, has_torch=True), alone)
    builder.check_build_python(load_preset("sglang"), TOOLS, BuildOptions())  # pip's isolated environment has it
    builder.check_build_python(load_preset("custom"), TOOLS, alone)  # pure Python: no torch in its build
    fake = tmp_path / "python"  # answers hosttune's one-liner as a Python with pip and torch would
    fake.write_text('#!/bin/sh\necho \'[3, 11, "cpython", "/p", "/p", true, true]\'\n')
    fake.chmod(0o755)
    from hosttune.build.toolchain import read_toolchain
    assert read_toolchain(str(fake), need_cuda=False).has_torch
