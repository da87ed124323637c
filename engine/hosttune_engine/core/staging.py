"""A step's inputs staged in pinned host memory and mirrored on the device, moved over in one copy.

The graphs read their inputs from fixed device buffers; the host writes the next step's into a pinned
twin and uploads it asynchronously. The copy may still be reading the host side when the next step is
filled (a step launched ahead), so `writable` waits for the event the last upload recorded. That wait is
nearly always over at once, since the copy runs ahead of the step it feeds.
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    """`size` int32 values on the host (`host`, pinned on CUDA) and on the device (`device_buffer`)."""

    def __init__(self, size: int, device: torch.device):
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.device_buffer = torch.zeros(size, dtype=torch.int32, device=device)
        self._copied: torch.cuda.Event | None = None  # recorded after the last upload (CUDA only)

    def writable(self) -> None:
        """Wait until the last upload has read the host buffer, so it can be written again."""
        if self._copied is not None:
            self._copied.synchronize()

    def upload(self, end: int | None = None) -> None:
        """One asynchronous copy of the first `end` values (all by default) from the host to the device."""
        self.device_buffer[:end].copy_(self.host[:end], non_blocking=True)
        if self.device_buffer.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()


class Uploads:
    """int32 arrays of any size moved to a new device tensor each through one pinned host buffer, grown as
    needed: the copy is asynchronous, so it does not wait for the device's earlier work (a step launched
    ahead of the one before). Off CUDA, a plain copy."""

    def __init__(self, device: torch.device):
        self.device = device
        self.host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    def upload(self, values: np.ndarray) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.from_numpy(values).to(self.device)
        if self._copied is not None:
            self._copied.synchronize()  # the last copy has read the host buffer
        n = len(values)
        if self.host is None or self.host.shape[0] < n:
            self.host = torch.empty(max(n, 2 * (0 if self.host is None else self.host.shape[0])), dtype=torch.int32,
                                    pin_memory=True)
        self.host[:n].numpy()[:] = values
        out = torch.empty(n, dtype=torch.int32, device=self.device)
        out.copy_(self.host[:n], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return out


def fed_ids(ids: torch.Tensor, feed: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """The step's token ids on the device: `ids`, except where `feed` >= 0, which takes row `feed` of
    `source` (the previous step's tokens, still on the device)."""
    return torch.where(feed >= 0, source[feed.clamp(min=0)].to(ids.dtype), ids)
