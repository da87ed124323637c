"""Real-time priority for timing tests."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def realtime():
    """Run the body at real-time priority when permitted (root on Linux), then restore.

    For timing-accuracy tests on a machine whose cores other processes share: the
    test measures bench's accuracy, not how long the scheduler makes it wait."""
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
