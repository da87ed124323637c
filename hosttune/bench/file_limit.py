"""The open files a run needs: a connection per closed-loop user, or per request in flight of an open loop, beside
the few the process holds anyway. A soft limit below that (`ulimit -n`, often 1024) fails the connections past it as
'Too many open files', which the report would count as the endpoint's transport errors: it is raised, up to the hard
limit, before the run, and a run that needs more than the hard limit is refused."""

from __future__ import annotations

from hosttune.bench.loadgen import MAX_IN_FLIGHT, Load
from hosttune.errors import BenchError

try:
    import resource
except ImportError:  # not a POSIX system: no limit to read
    resource = None

SPARE_FILES = 64  # the process's own: the interpreter's, /metrics polling, the result files


def allow_load(load: Load) -> None:
    """Raise the open-file limit for what `load` may hold open at once; refuse one the hard limit cannot hold."""
    if load.users is not None:
        allow_connections(load.users, f"--users {load.users}", "--users")
    elif load.max_concurrency is not None:
        allow_connections(load.max_concurrency, f"--max-concurrency {load.max_concurrency}", "--max-concurrency")
    else:
        allow_connections(MAX_IN_FLIGHT)  # as many as may be in flight; past the hard limit, arrivals fail as they come


def allow_connections(num_connections: int, given: str = "", option: str = "") -> None:
    if resource is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = num_connections + SPARE_FILES
    if _holds(soft, want):
        return
    raised = want if _holds(hard, want) else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (ValueError, OSError):
        raised = soft
    if given and not _holds(raised, want):
        raise BenchError(f"{given} needs a connection each, and this process may open {hard} files (ulimit -Hn): "
                         f"raise that limit, or give fewer {option}")


def _holds(limit: int, want: int) -> bool:
    return limit == resource.RLIM_INFINITY or limit >= want
