"""The `bench` extra: what `hosttune bench` needs beyond the control plane's own dependencies."""

from __future__ import annotations

from importlib.util import find_spec

from hosttune.errors import BenchError

REQUIRED = ("aiohttp", "matplotlib")  # the HTTP client and the plots; uvloop is used when present


def require_bench_extra() -> None:
    """Fail before any load is sent, rather than after a long run when the plots are drawn."""
    missing = [name for name in REQUIRED if find_spec(name) is None]
    if missing:
        raise BenchError(f"hosttune bench needs {' and '.join(missing)}: pip install 'hosttune[bench]'")
