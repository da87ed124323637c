"""The server's life: /health 503 -> 200 -> 503, SIGTERM drains in-flight requests and exits 0,
a drain past --shutdown-timeout aborts what is left, and failures exit non-zero."""

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from hosttune_engine.config import surely_cpu

from .harness import ServerProcess, get_json, metric, post

LONG = {"prompt": "When memory runs short", "max_tokens": 300, "temperature": 0, "ignore_eos": True}


async def _stream(session, url, body):
    """Stream a completion to the end; returns (status, text, finish reasons, saw [DONE], first-chunk event)."""
    async with session.post(url + "/v1/completions", json={**body, "stream": True}) as r:
        text, reasons, done = "", [], False
        async for line in r.content:
            line = line.strip()
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                chunk = json.loads(line[6:])
                text += "".join(c["text"] for c in chunk["choices"])
                reasons += [c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]]
        return r.status, text, reasons, done


async def _whole(session, url, body):
    async with session.post(url + "/v1/completions", json=body) as r:
        payload = await r.json()
        return r.status, payload


async def _sigterm_under_load(server: ServerProcess):
    url = server.url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        streams = [asyncio.create_task(_stream(session, url, LONG)) for _ in range(4)]
        wholes = [asyncio.create_task(_whole(session, url, LONG)) for _ in range(2)]  # these two wait in the queue
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            async with session.get(url + "/health") as r:
                body = await r.json()
            if body["running"] == 4 and body["queued"] == 2:
                break
            await asyncio.sleep(0.02)
        assert body["running"] == 4 and body["queued"] == 2, body
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.1)
        async with session.get(url + "/health") as r:
            draining = (r.status, (await r.json())["status"])
        async with session.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            refused = (r.status, r.headers.get("Retry-After"), (await r.json())["error"]["message"])
        return draining, refused, await asyncio.gather(*streams), await asyncio.gather(*wholes)


def test_health_and_sigterm_during_load(tiny_qwen2, tmp_path):
    server = ServerProcess(tiny_qwen2, tmp_path, ["--max-batch-size", "4", "--max-queue", "4",
                                                  "--shutdown-timeout", "60"])
    try:
        code, body = server.health()
        assert code == 503 and body["status"] == "starting"  # the socket opens before the model loads
        status, headers, raw = post(server.url + "/v1/completions", {"prompt": "hi"})
        assert status == 503 and headers["Retry-After"] == "1" and b"retry shortly" in raw
        assert metric(server.metrics(), "vllm:num_requests_rejected_total", reason="starting") == 1
        seen = server.wait_ready()
        assert seen[0] == "starting" and seen[-1] == "ready"
        code, body = server.health()
        assert code == 200 and body["running"] == 0 and body["gpu_utilization"] is None
        assert set(body) >= {"running", "queued", "kv_cache_usage", "tokens_per_second", "gpu_utilization"}
        draining, refused, streams, wholes = asyncio.run(_sigterm_under_load(server))
        assert draining == (503, "draining")
        assert refused[0] == 503 and refused[1] == "1" and "shutting down" in refused[2]
        for status, text, reasons, done in streams:
            assert status == 200 and reasons == ["length"] and done and text
        for status, payload in wholes:
            assert status == 200 and payload["usage"]["completion_tokens"] == 300
        assert server.proc.wait(60) == 0
    finally:
        server.terminate()
    log = server.log()
    assert "drained: every in-flight request finished" in log
    assert log.count("status=200") == 6 and "When memory runs short" not in log  # no prompt text in logs


def test_drain_past_shutdown_timeout_aborts_and_exits_0(tiny_qwen2, tmp_path):
    server = ServerProcess(tiny_qwen2, tmp_path, ["--shutdown-timeout", "0.3", "--log-prompts"])
    try:
        server.wait_ready()

        async def run():
            body = {**LONG, "max_tokens": 1000}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                task = asyncio.create_task(_stream(session, server.url, body))
                await asyncio.sleep(0.5)
                server.proc.send_signal(signal.SIGTERM)
                return await task

        t0 = time.monotonic()
        status, text, reasons, done = asyncio.run(run())
        assert status == 200 and reasons == ["abort"] and done, "an aborted stream still ends cleanly"
        assert server.proc.wait(30) == 0
        assert time.monotonic() - t0 < 10
    finally:
        server.terminate()
    assert "shutdown timeout: aborting 1 sequences" in server.log()
    assert "prompt='When memory runs short'" in server.log()  # --log-prompts


def test_second_sigterm_ends_the_drain_at_once(tiny_qwen2, tmp_path):
    server = ServerProcess(tiny_qwen2, tmp_path, ["--shutdown-timeout", "120"])
    try:
        server.wait_ready()

        async def run():
            body = {**LONG, "max_tokens": 1000}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                tasks = [asyncio.create_task(_stream(session, server.url, body)) for _ in range(2)]
                await asyncio.sleep(0.5)
                server.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)  # draining: the streams go on
                assert server.proc.poll() is None
                server.proc.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                results = await asyncio.gather(*tasks)
                code = await asyncio.get_running_loop().run_in_executor(None, server.proc.wait, 30)
                return results, code, time.monotonic() - sent

        results, code, seconds = asyncio.run(run())
        assert code == 0 and seconds < 1.0, seconds
        for status, text, reasons, done in results:
            assert status == 200 and reasons == ["abort"] and done and text
    finally:
        server.terminate()
    assert "stopping now: aborting 2 sequences in flight" in server.log()


def test_model_that_cannot_load_exits_1(tiny_qwen2, tmp_path):
    (tmp_path / "no-weights").mkdir()
    shutil.copy(tiny_qwen2 / "config.json", tmp_path / "no-weights")
    server = ServerProcess(tmp_path / "no-weights", tmp_path)
    code, body = server.health()
    assert code == 503
    assert server.proc.wait(60) == 1
    assert "engine failed" in server.log() and "has no *.safetensors weights" in server.log()
    assert "Traceback" not in server.log()  # the error says what to fix; no stack for bad input


# where the CUDA driver gives no GPU (or none loads), --device auto is the CPU before torch says so
NO_CUDA_DRIVER = pytest.mark.skipif(not surely_cpu("auto"), reason="a CUDA driver loads: auto may be a GPU")


@pytest.mark.parametrize("config_json, flags, message", [
    (None, [], "has no config.json; point `model` at a Hugging Face model folder"),
    ("{", [], "config.json: cannot read JSON: Expecting property name"),
    ("[1]", [], "config.json: holds a JSON list, not an object of model fields"),
    ("tiny", ["--max-model-len", "100000"], "max_model_len=100000 is past the model's 1024 positions"),
    ("tiny", ["--tokenizer", "{folder}"], "has no tokenizer.json (only fast tokenizers are supported)"),
    ("fp8", ["--quantization", "fp8"], "is already quantized (fp8-block); drop quantization='fp8'"),
    ("tiny", ["--device", "cpu", "--kernel-backend", "triton"],
     "kernel_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, slow)"),
    pytest.param("tiny", ["--kernel-backend", "triton"],
                 "kernel_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, slow)",
                 marks=NO_CUDA_DRIVER),
    pytest.param("tiny", ["--max-model-len", "1024", "--cpu-kv-cache-gib", "0.0001"],
                 "the KV cache fits 128 tokens, fewer than max_model_len=1024; raise cpu_kv_cache_gib or lower "
                 "max_model_len", marks=NO_CUDA_DRIVER),
    pytest.param("tiny", ["--block-size", "1048576"],  # 768 MiB a block, where the pool was one block whatever its size
                 "the KV cache fits no block of 1048576 tokens; raise cpu_kv_cache_gib or lower block_size",
                 marks=NO_CUDA_DRIVER),
])
def test_a_model_folder_that_cannot_serve_is_one_line_exit_2(tiny_qwen2, tmp_path, capsys, monkeypatch, config_json,
                                                             flags, message):
    # what config.json says is known before the socket opens, as `hosttune-engine plan` knows it
    from hosttune_engine.server.cli import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    if config_json == "fp8":  # a checkpoint whose config.json says its weights are FP8 already
        fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        config_json = json.dumps({**json.loads((tiny_qwen2 / "config.json").read_text()), "quantization_config": fp8})
    if config_json is not None:
        (tmp_path / "config.json").write_text((tiny_qwen2 / "config.json").read_text() if config_json == "tiny"
                                              else config_json)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tmp_path), *[f.format(folder=tmp_path) for f in flags]])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert err.startswith("hosttune-engine: error: ")


class _Driver:
    """libcuda.so.1: cuInit's code (100: no device), the GPUs it counts and its CUDA version (12040: 12.4)."""

    def __init__(self, init_rc: int, count: int, version: int = 12040):
        self.init_rc, self.count, self.version = init_rc, count, version

    def cuInit(self, flags):
        return self.init_rc

    def cuDeviceGetCount(self, count_ref):
        count_ref._obj.value = self.count
        return 0

    def cuDriverGetVersion(self, version_ref):
        version_ref._obj.value = self.version
        return 0


def _serve_before_the_socket(monkeypatch, driver: _Driver, torch_cuda: str | None, args: list[str]) -> SystemExit:
    """serve's exit on a host with `driver` and a torch built for `torch_cuda`, where opening the socket fails the
    test."""
    from hosttune_engine import config
    from hosttune_engine.server import serve
    from hosttune_engine.server.cli import main

    def opened(*args):
        raise AssertionError("the socket opened before the refusal")

    monkeypatch.setattr(config.ctypes, "CDLL", lambda name: driver)
    monkeypatch.setattr(config, "torch_cuda", lambda: torch_cuda)
    monkeypatch.setattr(serve, "Server", opened)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *args])
    return exit_.value


@pytest.mark.parametrize("driver, torch_cuda", [(_Driver(100, 0), "12.8"), (_Driver(0, 0), "12.8"),
                                                (_Driver(0, 2), None)], ids=["no-device", "none-counted", "cpu-torch"])
def test_auto_on_a_driver_without_a_usable_gpu_refuses_a_too_small_cpu_kv_cache_before_the_socket(
        tiny_qwen2, capsys, monkeypatch, driver, torch_cuda):
    """--device auto runs on the CPU where the driver loads but gives no GPU (none present or visible), or torch is
    a CPU build: its CPU KV cache is checked before the socket opens, not after the model loads behind a 503."""
    exit_ = _serve_before_the_socket(monkeypatch, driver, torch_cuda, [
        "--model", str(tiny_qwen2), "--max-model-len", "1024", "--cpu-kv-cache-gib", "0.0001"])
    assert exit_.code == 2 and capsys.readouterr().err == (
        "hosttune-engine: error: the KV cache fits 128 tokens, fewer than max_model_len=1024; raise cpu_kv_cache_gib "
        "or lower max_model_len\n")


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_gpus_whose_driver_is_older_than_torchs_cuda_are_refused_before_the_socket(tiny_qwen2, capsys, monkeypatch,
                                                                                  device):
    """Torch would see no GPU on it: 'auto' served on the CPU, 'cuda' failed behind a 503 after the socket opened."""
    exit_ = _serve_before_the_socket(monkeypatch, _Driver(0, 8, version=11040), "12.8",
                                     ["--model", str(tiny_qwen2), "--device", device])
    assert exit_.code == 2 and capsys.readouterr().err == (
        "hosttune-engine: error: the NVIDIA driver gives CUDA 11.4, older than the CUDA 12.8 torch was built for, "
        "so torch cannot use its 8 GPUs; update the driver, or use device='cpu'\n")


@pytest.mark.parametrize("driver, torch_cuda, message", [
    (_Driver(100, 0), "12.8", "device='cuda' but the CUDA driver gives no GPU (none loads, it fails to initialize, or "
                              "it counts none in CUDA_VISIBLE_DEVICES); use device='cpu' or 'auto'"),
    (_Driver(0, 2), None, "device='cuda' but torch is a build without CUDA; install a CUDA build of torch, or use "
                          "device='cpu' or 'auto'"),
], ids=["no-gpu", "cpu-torch"])
def test_device_cuda_without_a_gpu_torch_can_use_is_refused_before_the_socket(tiny_qwen2, capsys, monkeypatch, driver,
                                                                             torch_cuda, message):
    """It failed behind a 503 once the engine code had loaded, after the socket opened."""
    exit_ = _serve_before_the_socket(monkeypatch, driver, torch_cuda, ["--model", str(tiny_qwen2), "--device", "cuda"])
    assert exit_.code == 2 and capsys.readouterr().err == f"hosttune-engine: error: {message}\n"


def test_a_driver_of_torchs_cuda_major_passes_the_check(monkeypatch):
    """A 12.8 runtime runs on a 12.2 driver (minor version compatibility), and torch/version.py is read as written."""
    from hosttune_engine import config

    monkeypatch.setattr(config.ctypes, "CDLL", lambda name: _Driver(0, 1, version=12020))
    monkeypatch.setattr(config, "torch_cuda", lambda: "12.8")
    config.check_cuda_driver("auto")
    assert not config.surely_cpu("auto")
    assert config.TORCH_CUDA.search("__version__ = '2.8.0+cu128'\ncuda: Optional[str] = '12.8'\n").group(1) == "'12.8'"


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_serve_probes_the_cuda_driver_once_before_the_socket(tiny_qwen2, monkeypatch, device):
    """The driver check and the question whether 'auto' is the CPU share one cuInit and one read of torch's
    build, where each made its own."""
    from hosttune_engine import config
    from hosttune_engine.server.cli import check_model_folder

    driver, calls = _Driver(0, 1, version=12080), []
    monkeypatch.setattr(config.ctypes, "CDLL", lambda name: calls.append("CDLL") or driver)
    monkeypatch.setattr(driver, "cuInit", lambda flags: calls.append("cuInit") or 0)
    monkeypatch.setattr(config, "torch_cuda", lambda: calls.append("torch_cuda") or "12.8")
    check_model_folder(config.EngineConfig(model=str(tiny_qwen2), device=device))
    assert calls == ["CDLL", "cuInit", "torch_cuda"]
    calls.clear()
    check_model_folder(config.EngineConfig(model=str(tiny_qwen2), device="cpu"))
    assert calls == []


def test_missing_model_folder_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hosttune_engine", "serve", "--model", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"hosttune-engine: error: --model {tmp_path / 'missing'}: no such folder "
                                                "(give a Hugging Face model folder)"]


def test_a_step_log_in_a_missing_folder_is_one_line_exit_2(tmp_path):
    log = tmp_path / "no" / "steps.jsonl"
    proc = subprocess.run([sys.executable, "-m", "hosttune_engine", "serve", "--model", str(tmp_path),
                           "--step-log", str(log)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"hosttune-engine: error: --step-log {log}: its folder does not exist"]


def test_an_empty_step_log_is_one_line_exit_2_not_the_log_turned_off(tmp_path, capsys):
    from hosttune_engine.server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tmp_path), "--step-log", ""])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("hosttune-engine: error: --step-log is empty; give a file path, or leave the "
                                       "option out for no step log\n")


def test_a_step_log_that_is_a_folder_or_cannot_be_opened_is_one_line(tmp_path, capsys):
    from hosttune_engine.core.step_log import StepLog
    from hosttune_engine.errors import ConfigError
    from hosttune_engine.server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tmp_path), "--step-log", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"hosttune-engine: error: --step-log {tmp_path} is a folder; give a file path in it\n"
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.access(tmp_path / "ro", os.W_OK):  # root writes anywhere: a file path under a file fails for everyone
        target = tmp_path / "file" / "steps.jsonl"
        (tmp_path / "file").write_text("")
    else:
        target = tmp_path / "ro" / "steps.jsonl"
    with pytest.raises(ConfigError, match=f"step_log {target}: cannot append to it .*give a file in a folder"):
        StepLog(target)


def test_a_port_in_use_is_one_line_and_exit_1(tmp_path, caplog):
    import socket

    from hosttune_engine.config import EngineConfig
    from hosttune_engine.server.config import ServerConfig
    from hosttune_engine.server.serve import Server

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert asyncio.run(Server(ServerConfig(EngineConfig(model=str(tmp_path)), port=port)).run()) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"cannot listen on 127.0.0.1:{port}: ")
    assert "address already in use; free that address or give another --host/--port" in errors[0]


def test_an_address_not_on_this_machine_is_one_line_naming_host_and_exit_1(tmp_path, caplog):
    # 192.0.2.1 is a documentation address (TEST-NET-1): no machine has it, so binding fails at once
    from hosttune_engine.config import EngineConfig
    from hosttune_engine.server.config import ServerConfig
    from hosttune_engine.server.serve import Server

    config = ServerConfig(EngineConfig(model=str(tmp_path)), host="192.0.2.1", port=8000)
    assert asyncio.run(Server(config).run()) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("cannot listen on 192.0.2.1:8000: ")
    assert errors[0].endswith("; --host must be an address of this machine (127.0.0.1, or 0.0.0.0 for every "
                              "interface)"), errors[0]


def test_bad_options_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hosttune_engine", "serve", "--model", str(tmp_path),
                           "--max-batch-size", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == ("hosttune-engine serve: error: --max-batch-size: '0': give a whole "
                                                    "number > 0 (see hosttune-engine serve --help)\n")


@pytest.mark.parametrize("option, value, message", [
    ("--max-step-ms", "nan", "--max-step-ms: 'nan': give milliseconds (> 0), auto or off"),
    ("--max-step-ms", "inf", "--max-step-ms: 'inf': give milliseconds (> 0), auto or off"),
    ("--shutdown-timeout", "nan", "shutdown_timeout must be >= 0 seconds, got nan"),
    ("--header-timeout", "nan", "header_timeout and idle_timeout must be > 0 seconds, got nan and 75.0"),
    ("--idle-timeout", "inf", "header_timeout and idle_timeout must be > 0 seconds, got 10.0 and inf"),
    ("--cpu-kv-cache-gib", "nan", "cpu_kv_cache_gib must be > 0, got nan"),
    ("--max-num-batched-tokens", "16", "max_num_batched_tokens must be >= max_num_seqs"),
    ("--max-num-batched-tokens", "0", "max_num_batched_tokens must be >= max_num_seqs"),
    ("--max-model-len", "3", "max_model_len 3 leaves warmup's prompts no room; give 4 or more (or skip warmup)"),
    ("--served-model-name", " ", "served_model_name is empty; give the name clients send as 'model'"),
    # an empty host binds every interface: an unset $HOST must not serve other machines
    ("--host", "", "host is empty; give an address to listen on (127.0.0.1, or 0.0.0.0 for every interface)"),
])
def test_a_size_or_time_that_cannot_work_is_one_line_exit_2(tmp_path, capsys, option, value, message):
    from hosttune_engine.server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tmp_path), option, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_only_the_default_token_budget_grows_with_the_batch(tmp_path):
    from hosttune_engine.server.cli import _parser, config_from_args

    def budget(*flags):
        return config_from_args(_parser().parse_args(["serve", "--model", str(tmp_path), *flags])).engine
    assert budget().max_num_batched_tokens == 8192
    assert budget("--max-batch-size", "10000").max_num_batched_tokens == 10000
    assert budget("--max-num-batched-tokens", "512", "--max-batch-size", "64").max_num_batched_tokens == 512


# -- a fatal engine error, in-process (a real engine whose step starts raising) --------------------
class _InProcess:
    def __init__(self, model):
        from hosttune_engine.config import EngineConfig
        from hosttune_engine.server.config import ServerConfig
        from hosttune_engine.server.serve import Server, build_engine

        self.engine = None

        def factory(cfg):
            self.engine = build_engine(cfg)
            return self.engine

        self.server = Server(ServerConfig(EngineConfig(model=str(model), device="cpu", max_num_seqs=4), port=0),
                             engine_factory=factory)
        self.exit_code = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.exit_code = asyncio.run(self.server.run())

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.port and get_json(self.url + "/health")[0] == 200:
                return
            time.sleep(0.02)
        raise TimeoutError("in-process server not ready")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.port}"


def test_fatal_engine_error_fails_requests_and_exits_1(tiny_qwen2):
    srv = _InProcess(tiny_qwen2)
    srv.wait_ready()

    def broken_step():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    srv.engine.step = broken_step
    status, _, raw = post(srv.url + "/v1/completions", {"prompt": "hi", "max_tokens": 4})
    assert status == 500 and "engine failed" in json.loads(raw)["error"]["message"]
    srv.thread.join(30)
    assert not srv.thread.is_alive() and srv.exit_code == 1
    assert srv.server.state.health.phase.value == "failed"
    assert "illegal memory access" in srv.server.state.health.detail



def _while_loading(model, ask, max_model_len=None, **server_options):
    """What `ask(url)` returns from an in-process server whose model load waits until it has asked (then fails)."""
    from hosttune_engine.config import EngineConfig
    from hosttune_engine.server.config import ServerConfig
    from hosttune_engine.server.serve import Server

    asked = threading.Event()

    def factory(cfg):
        asked.wait(30)
        raise RuntimeError("the test's load ends here")

    server = Server(ServerConfig(EngineConfig(model=str(model), device="cpu", max_model_len=max_model_len), port=0,
                                 **server_options), engine_factory=factory)
    thread = threading.Thread(target=lambda: asyncio.run(server.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while server.port is None and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        return ask(f"http://127.0.0.1:{server.port}"), server.state.health.phase.value
    finally:
        asked.set()
        thread.join(30)


def test_models_says_the_context_it_will_serve_while_the_model_loads(tiny_qwen2):
    """--max-model-len and config.json say it before the weights load, where it was 0 until the engine was up."""
    def context(url):
        status, models = get_json(url + "/v1/models")
        return status, models["data"][0]["max_model_len"]

    assert _while_loading(tiny_qwen2, context) == ((200, 1024), "starting")
    assert _while_loading(tiny_qwen2, context, max_model_len=512) == ((200, 512), "starting")


def test_every_served_model_name_is_listed_and_answered_as_in_vllm(tiny_qwen2, tmp_path):
    """--served-model-name takes several names (vLLM's nargs='+'): /v1/models lists each, a request may name any,
    and answers name the first; it took one, and a second was an unrecognized argument (exit 2)."""
    from hosttune_engine.server.cli import _parser, config_from_args

    def config(*flags):
        return config_from_args(_parser().parse_args(["serve", "--model", str(tmp_path), *flags]))

    assert config("--served-model-name", "main", "alias").model_names == ("main", "alias")
    assert config("--served-model-name", "main").model_name == "main"
    assert config().model_names == (str(tmp_path),)

    def ask(url):
        models = [m["id"] for m in get_json(url + "/v1/models")[1]["data"]]
        return models, [post(url + "/v1/completions", {"model": name, "prompt": "hi"})[0]
                        for name in ("main", "alias", "other")]

    (models, statuses), _ = _while_loading(tiny_qwen2, ask, served_model_names=("main", "alias"))
    assert models == ["main", "alias"] and statuses == [503, 503, 404]  # 503: a served name, still loading


def _cors(url, method, origin, path="/v1/models", headers=None):
    """(status, the answer's CORS headers) of one request from a page of `origin`."""
    headers = {"Origin": origin, **(headers or {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, method=method, headers=headers), timeout=30) as r:
            status, got = r.status, r.headers
    except urllib.error.HTTPError as e:
        status, got = e.code, e.headers
    return status, {k: v for k, v in got.items() if k.startswith("Access-Control") or k == "Vary"}


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def test_allowed_origins_let_web_pages_call_the_api_as_vllm_lets_them(tiny_qwen2, tmp_path):
    """--allowed-origins (vLLM's flag, a JSON list): a preflight is answered before the API key is asked for, and
    each answer to an allowed origin, a 401 too, says the page may read it; where it was a 405 for any preflight.
    Without the option nothing changes: no origin is allowed."""
    from hosttune_engine.server.cli import _parser, config_from_args

    flags = ["serve", "--model", str(tmp_path), "--allowed-origins", '["https://ui.example"]']
    assert config_from_args(_parser().parse_args(flags)).allowed_origins == ("https://ui.example",)

    def ask(url):
        return [_cors(url, "OPTIONS", "https://ui.example", "/v1/chat/completions", PREFLIGHT),
                _cors(url, "GET", "https://ui.example"),
                _cors(url, "OPTIONS", "https://evil.example", "/v1/chat/completions", PREFLIGHT)]

    (preflight, get, other), _ = _while_loading(tiny_qwen2, ask, allowed_origins=("https://ui.example",),
                                                api_keys=("k" * 16,))
    assert preflight[0] == 200 and preflight[1]["Access-Control-Allow-Origin"] == "https://ui.example"
    assert preflight[1]["Access-Control-Allow-Headers"] == "authorization,content-type"
    assert "POST" in preflight[1]["Access-Control-Allow-Methods"]
    assert get == (401, {"Access-Control-Allow-Origin": "https://ui.example", "Vary": "Origin"})
    assert other == (400, {})
    (any_page, _), _ = _while_loading(tiny_qwen2, lambda url: (_cors(url, "GET", "https://a.example"), None),
                                      allowed_origins=("*",))
    assert any_page == (200, {"Access-Control-Allow-Origin": "*"})
    (closed, _), _ = _while_loading(tiny_qwen2, lambda url: (_cors(url, "OPTIONS", "https://a.example",
                                                                   "/v1/chat/completions", PREFLIGHT), None))
    assert closed == (405, {})


def test_serve_help_says_what_the_memory_and_graph_options_do(capsys, monkeypatch):
    from hosttune_engine.server.cli import main

    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width, hyphens included
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    # ModelRunner captures the decode, prompt-chunk and mixed-step graphs, or with --enforce-eager none of them
    assert ("--enforce-eager, --no-enforce-eager no CUDA graphs: decode, prompt-chunk and mixed steps all run eagerly"
            in text)
    # the pool is what the GPU share leaves (replicas sharing a GPU get the same), not what is free
    assert ("--num-kv-blocks NUM_KV_BLOCKS KV-cache size in blocks (default: what --gpu-memory-utilization leaves "
            "on a GPU, --cpu-kv-cache-gib on CPU)") in text


def test_serve_opens_its_socket_before_torch_is_imported(tmp_path):
    # /health answers (503 starting) while torch and the model load; the plan and tune commands' imports (torch)
    # must not come first. Checked in a fresh interpreter: main() refuses the folder right after parsing.
    code = ("import sys; from hosttune_engine.server.cli import main\n"
            "try:\n    main(['serve', '--model', sys.argv[1]])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr


def test_the_serve_options_import_only_the_standard_library_and_the_engine_config():
    # A deploy checks its flags with them before any host, in the control plane's interpreter (no torch, no aiohttp).
    code = ("import sys, hosttune_engine.server.options\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'triton', 'numpy', 'aiohttp'}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_deploy_check_knows_every_option_serve_parses():
    # an option added to the serve parser outside options.py would be refused by every deploy that sets it
    from hosttune_engine.server.cli import _parser
    from hosttune_engine.server.options import refusal

    commands = next(a for a in _parser(with_tools=False)._actions if isinstance(a, argparse._SubParsersAction))
    flags = {s for a in commands.choices["serve"]._actions for s in a.option_strings} - {"-h", "--help"}
    assert len(flags) > 30
    assert not [f for f in flags if (refusal([f]) or "").startswith(f"unrecognized arguments: {f}")]
    assert refusal(["--dtype", "float8"]) == ("argument --dtype: invalid choice: 'float8' "
                                              "(choose from 'auto', 'bfloat16', 'float16', 'float32')")
