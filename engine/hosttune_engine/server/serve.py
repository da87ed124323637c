"""The server's life: listen, load the engine, warm up, serve, drain on SIGTERM, exit.

The socket opens first, so /health answers 503 while the model loads (on a
thread) and while warmup runs; 200 only after that. SIGTERM or SIGINT stops
admitting (503), lets in-flight requests finish for up to `shutdown_timeout_s`,
aborts the rest and exits 0; a second SIGTERM aborts them at once (streams end with
finish_reason "abort") and exits 0. An engine that dies, fails to load or fails
warmup makes the process exit 1.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import threading
import time

from aiohttp import web

from hosttune_engine.config import EngineConfig
from hosttune_engine.errors import EngineError
from hosttune_engine.server.app import build_app
from hosttune_engine.server.config import ServerConfig
from hosttune_engine.server.connections import GuardedSite
from hosttune_engine.server.engine_client import EngineClient
from hosttune_engine.server.health import GpuMonitor, Phase
from hosttune_engine.server.state import ServerState
from hosttune_engine.server.warmup import warm_up, warmup_plan

log = logging.getLogger("hosttune_engine.server")

HEALTH_SAMPLE_S = 0.5
ABORT_GRACE_S = 2.0  # after the shutdown timeout, for aborted requests to send their last bytes


def _listen_advice(e: OSError) -> str:
    """What to change when the socket cannot open: the port when it is taken or privileged, else the host."""
    if e.errno == errno.EADDRINUSE:
        return "free that address or give another --host/--port"
    if e.errno == errno.EACCES:
        return "a port below 1024 needs root or CAP_NET_BIND_SERVICE; give another --port"
    return "--host must be an address of this machine (127.0.0.1, or 0.0.0.0 for every interface)"


def build_engine(config: EngineConfig):
    start = time.perf_counter()
    from hosttune_engine.core.engine import Engine  # loads torch and Triton

    log.info("engine code imported in %.1f s", time.perf_counter() - start)
    return Engine(config, measure_step_costs=False)  # after warmup (Server._measure_step_costs)


class Server:
    """Example: asyncio.run(Server(ServerConfig(EngineConfig(model="/models/qwen2.5-7b"))).run())"""

    def __init__(self, config: ServerConfig, engine_factory=build_engine):
        self.config = config
        self.engine_factory = engine_factory
        self.state = ServerState(config)
        self.exit_code = 0
        self.port: int | None = None
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self.site: GuardedSite | None = None

    async def run(self) -> int:
        """Serve until told to stop; returns the process exit code."""
        self._stopping, self._hurry = asyncio.Event(), asyncio.Event()
        runner = web.AppRunner(build_app(self.state), handler_cancellation=True, access_log=None,
                               shutdown_timeout=1.0, keepalive_timeout=self.config.idle_timeout_s)
        await runner.setup()
        self.site = GuardedSite(runner, self.config.host, self.config.port,
                                {"max_connections": self.config.max_connections,
                                 "header_timeout_s": self.config.header_timeout_s,
                                 "retry_after_s": self.config.retry_after_s})
        try:
            await self.site.start()
        except OSError as e:
            log.error("cannot listen on %s:%s: %s; %s", self.config.host, self.config.port, e, _listen_advice(e))
            await runner.cleanup()
            return 1
        self.port = runner.addresses[0][1]  # the real one when --port 0 asked for any free port
        log.info("listening on http://%s:%s (loading %s)", self.config.host, self.port, self.config.engine.model)
        if (defaults := self.state.sampling_defaults.describe()) is not None:
            log.info(defaults)
        self._install_signal_handlers()
        sampler = asyncio.create_task(self._sample_health())
        try:
            if await self._start_engine():
                self.state.metrics.set_baseline(self.state.client.stats())
                self.state.health.phase = Phase.READY
                log.info("ready: serving %s", self.state.model_name)
                await self._stopping.wait()
                if self.exit_code == 0:
                    await self._drain()
            return self.exit_code
        finally:
            sampler.cancel()
            await runner.cleanup()
            if self.state.client is not None:
                self.state.client.stop()

    def stop(self) -> None:
        """Begin the drain (what SIGTERM does); a second call ends it at once, aborting what is in flight."""
        if self._stopping is not None and self._stopping.is_set():
            if not self._hurry.is_set():
                log.warning("stopping now: aborting %d sequences in flight", self.state.admission.num_in_flight)
                self._hurry.set()
            return
        if self._stopping is not None:
            log.info("stopping: no new requests; draining up to %.0f s", self.config.shutdown_timeout_s)
            if self.state.health.phase is not Phase.FAILED:
                self.state.health.phase = Phase.DRAINING
            self._stopping.set()

    def fail(self, error: BaseException) -> None:
        # An EngineError (missing model files, bad config) says what to fix: its message is enough.
        log.error("engine failed: %s", error, exc_info=None if isinstance(error, EngineError) else error)
        self.state.health.phase = Phase.FAILED
        self.state.health.detail = f"{type(error).__name__}: {str(error)[:200]}"
        self.exit_code = 1
        if self._stopping is not None:
            self._stopping.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # embedded in a test or another program: it calls stop() itself
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    # -- starting -------------------------------------------------------------------------
    async def _start_engine(self) -> bool:
        """Load and warm up; False if a stop or a failure came first."""
        try:
            engine = await self._until_stopped(_in_thread(self.engine_factory, self.config.engine))
            if engine is None:
                return False
            client = EngineClient(engine, on_fatal=self.fail).start()
            self.state.attach(client, engine.tokenizer, engine.max_model_len, engine.model_config.vocab_size)
            self.state.health.gpu = GpuMonitor(_pci_bus_id(engine))
            if self.config.warmup:
                self.state.health.phase = Phase.WARMING_UP
                seconds = await self._until_stopped(warm_up(client, self._warmup_plan(engine, client),
                                                            getattr(engine, "limit_batched_tokens", None)))
                if seconds is None:
                    return False
                log.info("warmup done in %.1f s (%s)", sum(seconds.values()),
                         ", ".join(f"{name} {s:.2f}" for name, s in seconds.items()))
            if not await self._measure_step_costs(engine, client):
                return False
            compiles = getattr(engine, "kernel_compiles", None)
            if compiles is not None:
                compiles.mark_ready()  # from here each kernel built is a shape warmup missed
                log.info("%d kernel variants built during start, %.1f s of it", compiles.total, compiles.seconds)
            return True
        except Exception as e:
            self.fail(e)
            return False

    async def _measure_step_costs(self, engine, client: EngineClient) -> bool:
        """The step budget's cost model, timed on the idle engine after warmup: every kernel is compiled and
        every graph captured by then (warmup runs its steps without a time budget, as many as it needs and no
        more); each shape still runs more than once, since one slow first step (681 ms against 6 ms on an
        H200) would otherwise stand for it. False if a stop came first."""
        if not getattr(engine, "needs_step_costs", False):
            return True
        start = asyncio.get_running_loop().time()
        model = await self._until_stopped(client.when_idle(engine.measure_step_costs))
        if model is None:
            return False
        log.info("step costs measured in %.1f s", asyncio.get_running_loop().time() - start)
        return True

    def _warmup_plan(self, engine, client: EngineClient):
        cfg = self.config.engine
        kv_tokens = client.stats().num_kv_blocks * cfg.block_size
        graphs = engine.runner.graphs
        captured = graphs.sizes if graphs is not None and graphs.use_graphs else None
        return warmup_plan(cfg.max_num_seqs, engine.max_model_len, cfg.max_num_batched_tokens, kv_tokens,
                           engine.model_config.vocab_size, engine.runner.device.type == "cuda",
                           cfg.enable_prefix_caching, captured)

    async def _until_stopped(self, awaitable):
        """The awaitable's result, or None if stop() or fail() came first."""
        task = asyncio.ensure_future(awaitable)
        stopped = asyncio.create_task(self._stopping.wait())
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not task.done():
            task.cancel()
            return None
        return task.result()

    async def _sample_health(self) -> None:
        while True:
            stats = self.state.stats()
            if stats is not None:
                self.state.health.sample_tokens(stats.generation_tokens_total)
            await asyncio.sleep(HEALTH_SAMPLE_S)

    # -- stopping ---------------------------------------------------------------------------
    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_timeout_s
        admission = self.state.admission
        while admission.num_in_flight and loop.time() < deadline and self.exit_code == 0 and not self._hurry.is_set():
            await asyncio.sleep(0.05)
        if not admission.num_in_flight:
            log.info("drained: every in-flight request finished")
            return
        # Aborted sequences end with finish_reason "abort": streams still close with [DONE].
        if not self._hurry.is_set():
            log.warning("shutdown timeout: aborting %d sequences still in flight", admission.num_in_flight)
        self.state.abort_all()
        deadline = loop.time() + ABORT_GRACE_S
        while admission.num_in_flight and loop.time() < deadline:
            await asyncio.sleep(0.02)


def _in_thread(fn, *args) -> asyncio.Future:
    """Run fn on a daemon thread (a model load cannot be interrupted; a stop must not wait for it)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(setter, value):
        if not future.done():
            setter(value)

    def target():
        try:
            outcome = (future.set_result, fn(*args))
        except BaseException as e:
            outcome = (future.set_exception, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the event loop is gone: nobody waits for this any more
            pass

    threading.Thread(target=target, name="engine-load", daemon=True).start()
    return future


def _pci_bus_id(engine) -> str | None:
    device = engine.runner.device
    if device.type != "cuda":
        return None
    import torch

    p = torch.cuda.get_device_properties(device)
    try:
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except AttributeError:  # an older torch without the PCI fields
        return None
