"""What /health reports: the server's phase, its load, recent throughput and GPU utilization.

Only the `ready` phase answers 200. A load balancer therefore sends no traffic
while the model loads and warms up, and stops sending it as soon as a drain
begins (SIGTERM), while in-flight requests finish.
"""

from __future__ import annotations

import collections
import time
from enum import Enum

from hosttune_engine.core.messages import EngineStats


class Phase(Enum):
    STARTING = "starting"  # loading the model
    WARMING_UP = "warming_up"  # real generations through every compiled path
    READY = "ready"
    DRAINING = "draining"  # SIGTERM: no new requests, in-flight ones finish
    FAILED = "failed"  # the engine stopped on an error; the process is exiting


class TokenRate:
    """Generated tokens per second over the last `window_s`, from samples of a growing counter."""

    def __init__(self, window_s: float = 10.0):
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def sample(self, total_tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._samples.append((now, total_tokens))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class GpuMonitor:
    """GPU utilization through NVML when pynvml (nvidia-ml-py) loads and sees the GPU, else None."""

    def __init__(self, pci_bus_id: str | None):
        self._handle = None
        if pci_bus_id is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        except Exception:  # no library, no driver, or a bus id NVML does not know: report null
            self._handle = None

    def utilization(self) -> int | None:
        if self._handle is None:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except Exception:
            return None


class Health:
    def __init__(self, gpu: GpuMonitor | None = None):
        self.phase = Phase.STARTING
        self.tokens = TokenRate()
        self.gpu = gpu or GpuMonitor(None)
        self.detail: str | None = None  # why the server failed

    @property
    def is_ready(self) -> bool:
        return self.phase is Phase.READY

    def sample_tokens(self, total_tokens: int, now: float | None = None) -> None:
        """Throughput counts traffic only: samples taken while loading or warming up are left out, so the rate
        right after ready does not show warmup's generations."""
        if self.phase in (Phase.READY, Phase.DRAINING):
            self.tokens.sample(total_tokens, now)

    def status_code(self) -> int:
        return 200 if self.is_ready else 503

    def body(self, stats: EngineStats | None) -> dict:
        body = {"status": self.phase.value, "running": stats.num_running if stats else 0,
                "queued": stats.num_waiting if stats else 0,
                "kv_cache_usage": round(stats.kv_usage, 4) if stats else 0.0,
                "tokens_per_second": round(self.tokens.rate(), 1), "gpu_utilization": self.gpu.utilization()}
        if self.detail:
            body["detail"] = self.detail
        return body
