"""Real-time priority for timing tests."""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

# One timed body at a time on the machine, whichever pytest worker runs it.
LOCK = Path(tempfile.gettempdir()) / "hosttune-tests-realtime.lock"


@contextmanager
def realtime():
    """Run the body at real-time priority when permitted (root on Linux), then restore.

    For timing-accuracy tests on a machine whose cores other processes share: the
    test measures bench's accuracy, not how long the scheduler makes it wait. Real-time
    tasks of one priority do not share a core by turns (SCHED_FIFO runs each until it
    blocks), so two timed bodies at once, one per pytest worker, would delay each other
    by whole milliseconds: a lock file makes them take turns."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _fifo() as permitted:
            yield permitted


@contextmanager
def _fifo():
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, PermissionError, OSError):
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, policy, param)
