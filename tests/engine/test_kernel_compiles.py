"""The kernel-compile counter: Triton's build hooks, chained, counted and timed; warnings once ready."""

import logging
import time

import pytest

triton = pytest.importorskip("triton")
knobs = pytest.importorskip("triton.knobs")

from hosttune_engine.core import kernel_compiles  # noqa: E402
from hosttune_engine.core.kernel_compiles import KernelCompiles  # noqa: E402


class _Fn:  # what Triton hands its hooks as `fn` (a JitFunctionInfo)
    name = "_rms_norm_kernel"


@pytest.fixture
def fresh_hooks(monkeypatch):
    """Hooks and the process's counter as they were before the test, restored after it."""
    calls = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: calls.append(("cache", kw["fn"].name)))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: calls.append(("post", kw["fn"].name)))
    monkeypatch.setattr(kernel_compiles, "_installed", None)
    return calls


def _build(seconds=0.0):
    """Triton's side of one variant built: the cache hook, the compile, the post-compile hook."""
    skip = knobs.runtime.jit_cache_hook(key="k", repr="r", fn=_Fn(), compile={}, is_manual_warmup=False,
                                        already_compiled=False)
    time.sleep(seconds)
    knobs.runtime.jit_post_compile_hook(key="k", repr="r", fn=_Fn(), compile={}, is_manual_warmup=False,
                                        already_compiled=False)
    return skip


def test_counts_and_times_each_build_and_keeps_the_hooks_before_it(fresh_hooks):
    counter = kernel_compiles.install()
    assert kernel_compiles.install() is counter  # one counter a process: hooks chained once
    assert _build(0.02) is None  # the earlier cache hook's answer (None: build it) is what Triton gets
    _build()
    assert counter.total == 2 and counter.seconds >= 0.02
    assert fresh_hooks == [("cache", "_rms_norm_kernel"), ("post", "_rms_norm_kernel")] * 2


def test_a_build_after_ready_is_a_warning_naming_the_kernel(fresh_hooks, caplog):
    counter = kernel_compiles.install()
    with caplog.at_level(logging.WARNING, logger="hosttune_engine.core.kernel_compiles"):
        _build()
        assert not caplog.records  # warmup's builds are expected
        counter.mark_ready()
        _build()
    assert counter.total == 2
    assert len(caplog.records) == 1 and "_rms_norm_kernel was built while serving" in caplog.records[0].message
    assert caplog.records[0].message.endswith("the variant: r")  # Triton's description of what it built


def test_no_hooks_no_counter(monkeypatch):
    monkeypatch.setattr(kernel_compiles, "_installed", None)
    monkeypatch.setattr(knobs, "runtime", type("Runtime", (), {"jit_cache_hook": None})())
    assert kernel_compiles.install() is None


def test_counter_alone():
    c = KernelCompiles()
    c.after("k")  # a post hook without its cache hook (installed mid-build) counts, with no time
    assert (c.total, c.seconds) == (1, 0.0)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="Triton builds kernels only for a GPU")
def test_a_real_build_is_counted_once():
    import torch

    from hosttune_engine.kernels.rmsnorm import rms_norm

    counter = kernel_compiles.install()
    x, w = torch.randn(2, 3, device="cuda", dtype=torch.float16), torch.ones(3, device="cuda", dtype=torch.float16)
    before = counter.total
    rms_norm(x, w, 1e-6)  # a 3-wide row: a block size no engine step uses, so a variant this process lacks
    assert counter.total == before + 1
    rms_norm(x, w, 1e-6)
    assert counter.total == before + 1  # in Triton's memory now
