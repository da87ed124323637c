"""`hosttune-engine serve --tensor-parallel-size 2` on CPU: a killed rank ends the server non-zero within
10 s, SIGTERM drains the streams in flight and exits 0, and no rank's process outlives the server."""

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from .harness import ServerProcess, post
from .test_lifecycle import _stream

TP = ["--tensor-parallel-size", "2", "--max-batch-size", "4", "--skip-warmup"]
LONG = {"prompt": "When memory runs short", "max_tokens": 200, "temperature": 0, "ignore_eos": True}


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _post_until_cut(url: str, body: dict) -> None:
    try:
        post(url, body)
    except OSError:  # the server dies under it: that is the test
        pass


def _start(model, tmp_path) -> tuple[ServerProcess, list[int]]:
    server = ServerProcess(model, tmp_path, TP)
    server.wait_ready()
    workers = [pid for pid in _children(server.proc.pid) if "core.worker" in _cmdline(pid)]
    assert len(workers) == 1, workers
    return server, workers


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_killed_rank_ends_the_server_non_zero_within_10_s(tiny_qwen2, tmp_path):
    server, workers = _start(tiny_qwen2, tmp_path)
    try:
        request = threading.Thread(target=_post_until_cut, args=(server.url + "/v1/completions", LONG), daemon=True)
        request.start()  # a step in flight: rank 0 waits in a collective the killed rank never joins
        time.sleep(1.0)
        os.kill(workers[0], signal.SIGKILL)
        killed = time.monotonic()
        code = server.proc.wait(30)
        assert time.monotonic() - killed < 10
        assert code != 0
        assert "tensor-parallel rank 1 was killed by signal 9" in server.log()
    finally:
        server.terminate()
    assert not any(_running(pid) for pid in workers)


async def _streams_then_sigterm(server: ServerProcess):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        streams = [asyncio.create_task(_stream(session, server.url, LONG)) for _ in range(2)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            async with session.get(server.url + "/health") as r:
                if (await r.json())["running"] == 2:
                    break
            await asyncio.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        return await asyncio.gather(*streams)


def test_sigterm_drains_the_streams_and_stops_every_rank(tiny_qwen2, tmp_path):
    server, workers = _start(tiny_qwen2, tmp_path)
    try:
        streams = asyncio.run(_streams_then_sigterm(server))
        for status, text, reasons, done in streams:
            assert status == 200 and reasons == ["length"] and done and text
        assert server.proc.wait(60) == 0
    finally:
        server.terminate()
    assert not any(_running(pid) for pid in workers)
    assert not _children(server.proc.pid)


def test_a_size_that_does_not_split_the_heads_is_one_line_and_exit_2(tiny_qwen2, capsys):
    # config.json alone says so: refused as a bad option, before the socket opens or any rank starts
    from hosttune_engine.server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tiny_qwen2), "--tensor-parallel-size", "3", "--skip-warmup"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("hosttune-engine: error: tensor_parallel_size=3 must divide the model's 8 "
                                       "attention heads (2 KV heads); use one of 1, 2, 4, 8\n")
