"""A tensor-parallel rank above 0: its model runner, replaying the steps rank 0 broadcasts.

Started by rank 0 (`core.workers`) as `python -m hosttune_engine.core.worker RANK WORLD PORT CONFIG`
with the engine's config as JSON. It ignores SIGTERM and SIGINT, which a service manager sends the whole
process group: rank 0 drains and then tells it to stop (a `None` message). It exits as soon as rank 0 is
gone, so a killed server leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

PARENT_POLL_S = 0.2


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def run(rank: int, world_size: int, port: int, config_json: str) -> None:
    import torch

    from hosttune_engine.config import EngineConfig
    from hosttune_engine.core.device import resolve_device
    from hosttune_engine.core.model_runner import ModelRunner
    from hosttune_engine.model.model_config import ModelConfig
    from hosttune_engine.parallel.group import TensorParallelGroup, join_store
    from hosttune_engine.core.step_message import Mirrors

    config = EngineConfig(**json.loads(config_json))
    device = resolve_device(config.device)
    device = torch.device("cuda", rank) if device.type == "cuda" else device
    group = TensorParallelGroup.join(join_store(port, world_size), rank, world_size, device)
    runner = ModelRunner(config, ModelConfig.from_folder(config.model), group)
    mirrors = Mirrors()
    while (message := group.receive()) is not None:
        runner.replay(message.kind, mirrors.update(message), message.feed, message.sample)
    group.leave()


def main(argv: list[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    rank, world_size, port, config_json = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    run(rank, world_size, port, config_json)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: nothing left to flush, and torch's teardown may abort


if __name__ == "__main__":
    main(sys.argv[1:])
