"""A JSON line per collected step, for tuning a step budget on real traffic (torch-free).

Each line: `t` (when its tokens reached the host, `time.monotonic()`: one clock for every process
of the machine), `ms` (the step's real time, from the tokens of
the step before to its own; null after an idle engine), `decodes`, `prefill_tokens`, `prefill_seqs`,
`estimate_ms` (the cost model's time for a step held to a budget, else null), `scale` (the budget's
correction then, see core/step_budget.py) and `priority` (the most important sequence in the step).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from hosttune_engine.core.scheduler_output import SchedulerOutput
from hosttune_engine.errors import ConfigError

log = logging.getLogger(__name__)


class StepLog:
    FLUSH_S = 1.0  # lines reach the file at least this often

    def __init__(self, path: str | Path):
        self.path = path
        try:
            self._file = open(path, "a", buffering=1 << 16)
        except OSError as e:
            raise ConfigError(f"step_log {path}: cannot append to it ({e.strerror}); give a file in a folder you "
                              "can write") from None
        self._flushed = time.monotonic()

    def write(self, sched: SchedulerOutput, at: float, real_s: float | None, scale: float) -> None:
        """One step, whose tokens reached the host `at` (`time.monotonic()`)."""
        if self._file is None:
            return
        prefill = [n for n in sched.num_new_tokens if n > 1]
        record = {
            "t": round(at, 4),
            "ms": None if real_s is None else round(real_s * 1e3, 3),
            "decodes": len(sched.num_new_tokens) - len(prefill),
            "prefill_tokens": sum(prefill),
            "prefill_seqs": len(prefill),
            "estimate_ms": None if sched.estimate_s is None else round(sched.estimate_s * 1e3, 3),
            "scale": round(scale, 4),
            "priority": min((s.priority for s in sched.seqs), default=None),
        }
        try:
            self._file.write(json.dumps(record) + "\n")
            if record["t"] - self._flushed >= self.FLUSH_S:
                self._file.flush()
                self._flushed = record["t"]
        except OSError as e:  # a full disk: the log is for tuning, the steps must go on
            self._stop(e)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                self._stop(e)
            self._file = None

    def _stop(self, error: OSError) -> None:
        log.error("step log %s: cannot write to it (%s); the engine goes on without it", self.path, error.strerror)
        file, self._file = self._file, None
        try:
            file.close()  # its buffer cannot be written either
        except OSError:
            pass
