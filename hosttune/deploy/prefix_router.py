# Runs ON THE HOST with the live release's python (which has aiohttp, as every engine does), beside
# prefix_table.py: `python prefix_router.py --host 127.0.0.1 --port PORT ...` (--help lists the flags).
"""The prefix router: a reverse proxy between a host's nginx and its replicas that sends requests
sharing a prompt prefix to the replica holding it (prefix_table.py places them).

Every request is passed on as it came (method, path, query, headers with the API key, body) and its
answer streamed back chunk by chunk. A replica that refuses the connection is taken out of rotation
and the request sent once more, to another. Admin API (replica_lb.py's): POST /add_worker?url=,
POST /remove_worker?url=, GET /list_workers. A health loop takes replicas that stop answering their
health endpoint out of rotation and back once they answer; /metrics on its own port counts requests
and keys per replica, in Prometheus' text format.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

if __package__:  # imported from hosttune (its tests)
    from hosttune.deploy.prefix_table import DEFAULT_MAX_KEYS, DEFAULT_PREFIX_CHARS, NoWorker, PrefixTable, prefix_key
else:  # on the host, run as a script beside prefix_table.py
    from prefix_table import DEFAULT_MAX_KEYS, DEFAULT_PREFIX_CHARS, NoWorker, PrefixTable, prefix_key

POLICIES = ("prefix_affinity", "least_in_flight")  # the second: no placement by prefix, to compare against
# Per hop, never passed on (RFC 9110 7.6.1), and what aiohttp sets itself.
HOP_HEADERS = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length"))
AUTO_HEADERS = ("User-Agent", "Accept-Encoding")  # only the client's own
log = logging.getLogger("hosttune-router")


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = POLICIES[0]
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 0  # 0: no /metrics
    health_check_endpoint: str = "/health"
    health_check_interval_secs: float = 2.0
    health_failure_threshold: int = 2
    prefix_chars: int = DEFAULT_PREFIX_CHARS
    max_keys: int = DEFAULT_MAX_KEYS
    request_timeout_secs: float = 3600.0
    worker_urls: tuple[str, ...] = ()
    log_level: str = "warning"


class Router:
    """The table, the client session to the replicas, and what /metrics reports."""

    def __init__(self, config: RouterConfig):
        self.config = config
        self.table = PrefixTable(config.max_keys, by_prefix=config.policy == POLICIES[0])
        self.routed: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.retried = 0
        self.session: aiohttp.ClientSession | None = None
        for url in config.worker_urls:
            self.add(url)

    def add(self, url: str) -> bool:
        self.routed.setdefault(url, 0)
        self.failures[url] = 0
        return self.table.add(url)

    def remove(self, url: str) -> bool:
        self.failures.pop(url, None)
        return self.table.remove(url)

    # -- proxying
    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        key = prefix_key(body, self.config.prefix_chars)
        failed: frozenset[str] = frozenset()
        for _ in range(2):
            try:
                worker = self.table.choose(key, failed).worker
            except NoWorker:
                break
            try:
                upstream = await self._connect(worker, request, body)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return _error(f"the replica failed: {exc!r}", 502)
            if upstream is not None:
                return await self._relay(worker, upstream, request)
            failed |= {worker}
            self.retried += 1
        return _error("no replica could take the request", 502 if failed else 503)

    async def _connect(self, worker: str, request: web.Request, body: bytes) -> aiohttp.ClientResponse | None:
        """The replica's response (headers read), or None when it could not be reached (then out of rotation)."""
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS)
        self.table.start(worker)
        try:
            return await self.session.request(request.method, worker + request.raw_path, headers=headers,
                                              data=body or None, allow_redirects=False, skip_auto_headers=AUTO_HEADERS)
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            self.table.finish(worker)
            self.table.set_up(worker, False)
            log.warning("%s: %s; out of rotation until its health check passes", worker, exc)
            return None
        except BaseException:
            self.table.finish(worker)
            raise

    async def _relay(self, worker: str, upstream: aiohttp.ClientResponse, request: web.Request) -> web.StreamResponse:
        """The replica's answer to the client as it comes; the replica's connection closed if the client leaves."""
        self.routed[worker] = self.routed.get(worker, 0) + 1
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        out.headers.extend((k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS)
        try:
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
        except BaseException:
            upstream.close()  # the replica stops the generation nobody reads
            raise
        finally:
            upstream.release()
            self.table.finish(worker)
        return out

    # -- health
    async def check(self, worker: str) -> None:
        """One health check: `failure_threshold` failures in a row take it out, one success puts it back."""
        url = worker + self.config.health_check_endpoint
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                healthy = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            healthy = False
        if worker not in self.failures:
            return  # removed meanwhile
        self.failures[worker] = 0 if healthy else self.failures[worker] + 1
        if healthy or self.failures[worker] >= self.config.health_failure_threshold:
            self.table.set_up(worker, healthy)

    async def health_loop(self) -> None:
        while True:  # a replica is in rotation from when it is added (replica_lb.py adds healthy ones)
            await asyncio.sleep(self.config.health_check_interval_secs)
            await asyncio.gather(*(self.check(w) for w in list(self.table.workers)))

    # -- admin and metrics
    async def admin(self, request: web.Request) -> web.Response:
        url = request.query.get("url", "").rstrip("/")
        if not _is_worker_url(url):
            return web.json_response({"error": f"url must be http(s)://HOST:PORT, not {url!r}"}, status=400)
        changed = self.add(url) if request.path == "/add_worker" else self.remove(url)
        return web.json_response({"url": url, "changed": changed})

    async def list_workers(self, request: web.Request) -> web.Response:
        return web.json_response({"urls": list(self.table.workers)})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(self), content_type="text/plain")


def _error(message: str, status: int) -> web.Response:
    """An OpenAI-shaped error of the router's own."""
    return web.json_response({"error": {"message": message, "type": "router"}}, status=status)


def _is_worker_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.path and not parts.query


def metrics_text(router: Router) -> str:
    """Prometheus' text format: requests sent, keys held, in flight and up, per replica."""
    table = router.table
    series = (("requests_total", "counter", "requests sent to the replica", router.routed),
              ("keys", "gauge", "prompt prefixes the replica holds", table.keys_per_worker()),
              ("in_flight", "gauge", "requests the replica is answering", {w: table.in_flight[w] for w in table.workers}),
              ("worker_up", "gauge", "1 while the replica is in rotation", {w: int(w not in table.down) for w in table.workers}))
    lines = []
    for name, kind, text, values in series:
        lines += [f"# HELP hosttune_router_{name} {text}", f"# TYPE hosttune_router_{name} {kind}"]
        lines += [f'hosttune_router_{name}{{worker="{w}"}} {n}' for w, n in values.items()]
    lines += ["# HELP hosttune_router_retries_total requests sent again after a replica refused them",
              "# TYPE hosttune_router_retries_total counter", f"hosttune_router_retries_total {router.retried}"]
    return "\n".join(lines) + "\n"


def make_app(router: Router) -> web.Application:
    """The proxy: the admin API, everything else to a replica."""
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/add_worker", router.admin)
    app.router.add_post("/remove_worker", router.admin)
    app.router.add_get("/list_workers", router.list_workers)
    app.router.add_route("*", "/{tail:.*}", router.forward)
    app.cleanup_ctx.append(lambda _: _session(router))
    return app


async def _session(router: Router):
    """The replicas' client session and the health loop, for the app's life."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=router.config.request_timeout_secs)
    # idle connections closed before a replica closes them (uvicorn: after 5 s), so none is reused as it closes
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)
    router.session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                           auto_decompress=False)
    health = asyncio.ensure_future(router.health_loop())
    yield
    health.cancel()
    await router.session.close()


def app_runner(app: web.Application) -> web.AppRunner:
    """A client that goes away cancels its handler, which closes the replica's connection: the replica stops."""
    return web.AppRunner(app, access_log=None, handler_cancellation=True)


def metrics_app(router: Router) -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", router.metrics)
    return app


def parse_config(argv: list[str]) -> RouterConfig:
    """The flags, or a one-line error and exit 2."""
    parser = argparse.ArgumentParser(prog="prefix_router.py", description=__doc__.splitlines()[0])
    for name, default in vars(RouterConfig()).items():
        flag = "--" + name.replace("_", "-")
        if name == "worker_urls":
            parser.add_argument(flag, nargs="*", default=[])
        elif name == "policy":
            parser.add_argument(flag, choices=POLICIES, default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = vars(parser.parse_args(argv))
    args["worker_urls"] = tuple(u.rstrip("/") for u in args["worker_urls"])
    config = RouterConfig(**args)
    problem = config_problem(config)
    if problem:
        parser.error(problem)
    return config


def config_problem(config: RouterConfig) -> str | None:
    if config.prefix_chars < 1 or config.max_keys < 1:
        return "--prefix-chars and --max-keys take a count of at least 1"
    if config.health_failure_threshold < 1 or config.health_check_interval_secs <= 0:
        return "--health-failure-threshold takes at least 1, --health-check-interval-secs a positive number of seconds"
    if not config.health_check_endpoint.startswith("/"):
        return f"--health-check-endpoint takes a path starting with /, not {config.health_check_endpoint!r}"
    bad = [u for u in config.worker_urls if not _is_worker_url(u)]
    return f"--worker-urls takes http(s)://HOST:PORT, not {bad[0]!r}" if bad else None


async def serve(config: RouterConfig) -> None:
    router = Router(config)
    runners = [app_runner(make_app(router))]
    sites = [(config.host, config.port)]
    if config.prometheus_port:
        runners.append(app_runner(metrics_app(router)))
        sites.append((config.prometheus_host, config.prometheus_port))
    for runner, (host, port) in zip(runners, sites):
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
    log.warning("routing (%s) on %s:%d over %s", config.policy, config.host, config.port, list(config.worker_urls))
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    config = parse_config(argv)
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config))


if __name__ == "__main__":
    main(sys.argv[1:])
