"""Rank 0's side of a tensor-parallel engine: start the other ranks, watch them, stop them.

One process per rank above 0 (`core.worker`), each on its own GPU. A watcher thread polls them: a
rank that exits while the engine runs (killed, out of memory, a NCCL error) leaves the others blocked in
a collective that will never complete, so the watcher kills the rest and ends this process with exit
code 1 at once, and a service manager restarts it. `stop` is the orderly end: a `None` message, then
the processes' exit, killed if they take too long.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from hosttune_engine.config import EngineConfig
from hosttune_engine.core.device import resolve_device, resolve_dtype
from hosttune_engine.core.model_runner import ModelRunner
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.checks import check_startup
from hosttune_engine.parallel.group import TensorParallelGroup, open_store

POLL_S = 0.2
STOP_TIMEOUT_S = 10.0
DEATH_WAIT_S = 2.0
EXIT_CODE = 1


class Workers:
    """Ranks 1..world_size-1 of one engine, started against rank 0's rendezvous port."""

    def __init__(self, config: EngineConfig, port: int):
        self.world_size = config.tensor_parallel_size
        payload = json.dumps(dataclasses.asdict(config))
        self.processes = [
            subprocess.Popen([sys.executable, "-m", "hosttune_engine.core.worker", str(rank),
                              str(self.world_size), str(port), payload], stdin=subprocess.DEVNULL, env=_env())
            for rank in range(1, self.world_size)]
        self._stopping = threading.Event()
        threading.Thread(target=self._watch, name="tp-watch", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def _watch(self) -> None:
        while not self._stopping.is_set():
            self._die_if_one_exited()
            time.sleep(POLL_S)

    def _die_if_one_exited(self) -> None:
        for rank, process in enumerate(self.processes, start=1):
            code = process.poll()
            if code is not None and not self._stopping.is_set():
                self._die(rank, code)

    def exit_if_one_died(self, within_s: float = DEATH_WAIT_S) -> None:
        """After a collective failed on rank 0: if a rank exits within `within_s` (gloo reports a peer's
        death as a connection reset, maybe before its process is reaped), say which and exit at once."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            self._die_if_one_exited()
            time.sleep(POLL_S / 4)

    def _die(self, rank: int, code: int) -> None:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"hosttune-engine: error: tensor-parallel rank {rank} {how}; stopping every rank",
              file=sys.stderr, flush=True)
        self.kill()
        os._exit(EXIT_CODE)

    def stop(self, group: TensorParallelGroup) -> None:
        """The orderly end: tell every rank to stop, wait for them (killing what is left), leave the group."""
        self._stopping.set()
        try:
            group.broadcast(None)
        except RuntimeError:  # a rank is gone already: what is left gets killed
            pass
        self.wait()
        group.leave()

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Wait for every rank to exit (after the stop message), killing what is left after `timeout`."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.kill()

    def kill(self) -> None:
        self._stopping.set()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait()


def _env() -> dict[str, str]:
    """This environment, with this copy of the engine first on the path (it may not be installed)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def start_tensor_parallel(config: EngineConfig, model_config: ModelConfig) -> tuple[ModelRunner, Workers]:
    """Check, start the other ranks, and build rank 0's runner (this process, on the first GPU)."""
    device = resolve_device(config.device)
    check_startup(config, model_config, device, resolve_dtype(config.dtype, model_config.dtype, device))
    store = open_store(config.tensor_parallel_size)
    workers = Workers(config, store.port)
    rank0 = torch.device("cuda", 0) if device.type == "cuda" else device
    group = TensorParallelGroup.join(store, 0, config.tensor_parallel_size, rank0)
    try:
        return ModelRunner(config, model_config, group), workers
    except BaseException:
        workers.kill()
        group.leave()
        raise
