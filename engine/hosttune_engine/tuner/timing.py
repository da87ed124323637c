"""Timing a kernel call as a decode step runs it: a CUDA graph that calls it once on each of several copies of
its weights (together more bytes than the L2), replayed; on a CPU (the tests' Triton interpreter), wall time."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

L2_SPAN = 256 << 20  # the weight copies one timing graph reads span at least this many bytes
MOST_COPIES = 24


@dataclass(frozen=True)
class Timer:
    device: torch.device
    replays: int = 10

    def copies(self, nbytes: int) -> int:
        """How many copies of `nbytes` of weights a timing reads (one on a CPU)."""
        return 1 if self.device.type != "cuda" else max(2, min(MOST_COPIES, -(-L2_SPAN // max(1, nbytes))))

    def per_call_ms(self, calls: list[Callable[[], object]]) -> float:
        """Median ms of one call of `calls` (each called once per replay)."""
        for c in calls:
            c()
        if self.device.type != "cuda":
            start = time.perf_counter()
            for c in calls:
                c()
            return (time.perf_counter() - start) * 1e3 / len(calls)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        graph.replay()
        torch.cuda.synchronize(self.device)
        return statistics.median(self._replay_ms(graph) for _ in range(self.replays)) / len(calls)

    @staticmethod
    def _replay_ms(graph) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max |want|."""
    want = want.float()
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
