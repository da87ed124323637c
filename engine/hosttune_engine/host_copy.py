"""Device tensors on their way to the host, without waiting for the device when the copy is asked for.

The engine reads a step's tokens after it launched the next step. A copy enqueued at read time would queue
behind that next step, so the read would wait for it too and the device would idle meanwhile. A `HostCopy`
enqueues its copies when it is made (right behind the work that produced the tensors) and records an event;
`lists` waits for that event alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class HostCopy:
    """Copies of `tensors` (None entries stay None) to the host, enqueued now; `into` gives the host buffers
    (pinned, the same shapes) where the caller keeps its own, otherwise each copy gets a new pinned one."""

    def __init__(self, tensors: Sequence[torch.Tensor | None], into: Sequence[torch.Tensor] | None = None):
        if into is None:
            self.host = [t if t is None else t.to("cpu", non_blocking=True, copy=True) for t in tensors]
        else:
            if len(into) != len(tensors):
                raise ValueError(f"{len(tensors)} tensors to copy but {len(into)} host buffers")
            self.host = [dst.copy_(src, non_blocking=True) for dst, src in zip(into, tensors)]
        self.event: torch.cuda.Event | None = None
        if any(t is not None and t.is_cuda for t in tensors):
            self.event = torch.cuda.Event()
            self.event.record()

    def lists(self) -> list[list | None]:
        """The copies as Python lists, once they have landed (the only wait)."""
        if self.event is not None:
            self.event.synchronize()
        return [t if t is None else t.tolist() for t in self.host]
