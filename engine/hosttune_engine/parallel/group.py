"""The ranks of one tensor-parallel engine and the collectives between them.

torch.distributed does the work: NCCL for the model's collectives on CUDA, gloo on CPU (so CPU tests run
the same code), and a gloo group beside NCCL for the step messages rank 0 broadcasts to the others.
Rank 0 opens the rendezvous store on a free port before it starts the workers, so nothing races for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = timedelta(minutes=30)  # a step waits this long at most; a dead rank is caught sooner (workers.py)


def open_store(world_size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a port the OS picks (`store.port`)."""
    return dist.TCPStore(HOST, 0, world_size, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def join_store(port: int, world_size: int) -> dist.TCPStore:
    return dist.TCPStore(HOST, port, world_size, is_master=False, timeout=TIMEOUT)


@dataclass
class TensorParallelGroup:
    """This process's rank, its device, and the process groups of its engine."""

    rank: int
    world_size: int
    device: torch.device
    device_group: object  # the model's all-reduce and all-gather
    cpu_group: object  # step messages (gloo)
    cpu_threads: int | None = None  # on CPU: this process's thread count before it joined, restored on leave

    @classmethod
    def join(cls, store: dist.TCPStore, rank: int, world_size: int, device: torch.device) -> "TensorParallelGroup":
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, timeout=TIMEOUT,
                                    device_id=device)
            return cls(rank, world_size, device, dist.group.WORLD, dist.new_group(backend="gloo", timeout=TIMEOUT))
        # The ranks share the process's cores: with more threads than cores each collective waits for a rank
        # whose threads spin elsewhere (a 135M model's step took 18 s instead of 0.4 on 2 cores).
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, threads // world_size))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)
        return cls(rank, world_size, device, dist.group.WORLD, dist.group.WORLD, threads)

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.cpu_threads is not None:
            torch.set_num_threads(self.cpu_threads)

    # -- inside the model --------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        dist.all_reduce(x, group=self.device_group)
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, C] on every rank -> [N, world_size * C], rank r's columns at r * C."""
        n, c = x.shape
        out = x.new_empty(self.world_size * n, c)  # [R * N, C]: rank r's rows at r * N
        _all_gather(out, x.contiguous(), group=self.device_group)
        return out.view(self.world_size, n, c).permute(1, 0, 2).reshape(n, self.world_size * c)

    # -- between steps -----------------------------------------------------------------
    def broadcast(self, message) -> None:
        """Rank 0: send one picklable message to every other rank."""
        dist.broadcast_object_list([message], src=0, group=self.cpu_group)

    def receive(self):
        """Ranks > 0: the next message rank 0 broadcasts."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def min_over_ranks(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())


_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
