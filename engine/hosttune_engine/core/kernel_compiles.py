"""Triton kernel variants built in this process: compiled, or loaded from Triton's on-disk compile cache.

Triton builds a kernel variant the first time a launch meets a new specialisation (dtypes, constexprs,
which integer arguments are 1 or multiples of 16). That takes 0.1-2 s with a cold compile cache and tens of
milliseconds with a warm one, and every step running at the time waits for it. Warmup exists so that none
happens while serving; this counter shows whether that held: `EngineStats.kernel_compiles_total` (and
`/metrics`) counts them, and each one after `mark_ready` is logged as a warning naming the kernel, since a
request waited for it.

Triton calls one hook before building a variant and one after (`triton.knobs.runtime.jit_cache_hook` and
`jit_post_compile_hook`); the counter chains to hooks already installed. A Triton without those knobs gives
no counter (`install` returns None), never a count that stays at 0.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class KernelCompiles:
    """Counts the variants built after `install`; `total` and `seconds` only grow."""

    def __init__(self):
        self.total = 0
        self.seconds = 0.0
        self.ready = False
        self._started = threading.local()
        self._lock = threading.Lock()

    def before(self, name: str, variant: str | None = None) -> None:
        self._started.at = time.perf_counter()

    def after(self, name: str, variant: str | None = None) -> None:
        started = getattr(self._started, "at", None)
        seconds = time.perf_counter() - started if started is not None else 0.0
        self._started.at = None
        with self._lock:
            self.total += 1
            self.seconds += seconds
        if self.ready:
            log.warning("kernel %s was built while serving (%.0f ms, the steps running then waited): warmup "
                        "did not cover this shape%s", name, seconds * 1e3,
                        f"; the variant: {variant}" if variant else "")

    def mark_ready(self) -> None:
        """From now on each variant built is logged as a warning."""
        self.ready = True


_installed: KernelCompiles | None = None


def install() -> KernelCompiles | None:
    """The process's counter, its hooks installed on first call; None where Triton has no such hooks."""
    global _installed
    if _installed is not None:
        return _installed
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not all(hasattr(runtime, h) for h in ("jit_cache_hook", "jit_post_compile_hook")):
        return None
    counter = KernelCompiles()
    runtime.jit_cache_hook = _chained(runtime.jit_cache_hook, counter.before)
    runtime.jit_post_compile_hook = _chained(runtime.jit_post_compile_hook, counter.after)
    _installed = counter
    return counter


def _chained(previous, record):
    """A hook that records the kernel's name, then defers to `previous` (whose answer Triton acts on: a true
    answer from the cache hook skips the build)."""

    def hook(*args, **kwargs):
        # Triton passes a JitFunctionInfo and `repr`: the launch options and each argument's specialisation
        record(getattr(kwargs.get("fn"), "name", "?"), kwargs.get("repr"))
        return previous(*args, **kwargs) if previous is not None else None

    return hook
