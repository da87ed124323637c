"""The prefix router in process, between a real aiohttp client and real aiohttp replicas: answers streamed
chunk by chunk, the request passed on whole (key included), a dead replica retried on another, the admin
API replica_lb.py uses, the health loop, /metrics, and its flags."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from aiohttp import web

from hosttune.deploy.prefix_router import Router, RouterConfig, app_runner, make_app, metrics_app, parse_config

SYSTEM = "You are a terse assistant who answers in one word. " * 8


class Replica:
    """A replica that records what reached it; /v1/completions streams two chunks, the second once `go` is set."""

    def __init__(self):
        self.seen: list[dict] = []
        self.go = asyncio.Event()
        self.health = 200
        self.cancelled = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def complete(self, request: web.Request) -> web.StreamResponse:
        self.seen.append({"method": request.method, "path_qs": request.path_qs, "auth": request.headers.get("Authorization"),
                          "body": await request.read()})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Replica": self.url})
        await out.prepare(request)
        await out.write(b"data: first\n\n")
        try:
            await asyncio.wait_for(self.go.wait(), 5)
        except asyncio.CancelledError:
            self.cancelled += 1  # its client (the router) went away
            raise
        await out.write(b"data: [DONE]\n\n")
        return out

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/health", self.healthz)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self.url


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = app_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def dead_url() -> str:
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def run(scenario, num_replicas=2, **config):
    """Replicas, the router over them (plus `worker_urls`), and scenario(client, router, router_url, replicas)."""
    async def main():
        replicas = [Replica() for _ in range(num_replicas)]
        urls = [await r.start() for r in replicas]
        router = Router(RouterConfig(worker_urls=(*urls, *config.pop("worker_urls", ())), **config))
        runner, url = await serve(make_app(router))
        try:
            async with aiohttp.ClientSession() as client:
                return await scenario(client, router, url, replicas)
        finally:
            await runner.cleanup()
            for r in replicas:
                await r.runner.cleanup()
    return asyncio.run(asyncio.wait_for(main(), 20))


def completion(prompt=SYSTEM + "Colour?") -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, "stream": True}).encode()


def test_the_answer_streams_through_chunk_by_chunk_with_the_request_passed_on_whole():
    async def scenario(client, router, url, replicas):
        async with client.post(url + "/v1/completions?x=1&y=%2F", data=completion(),
                               headers={"Authorization": "Bearer ht-secret"}) as resp:
            first = await resp.content.readany()  # before the replica sends the rest
            for r in replicas:
                r.go.set()
            rest = await resp.content.read()
            return resp.status, resp.headers["Content-Type"], first, rest, [r.seen for r in replicas]

    status, kind, first, rest, seen = run(scenario)
    assert (status, kind, first, rest) == (200, "text/event-stream", b"data: first\n\n", b"data: [DONE]\n\n")
    (got,) = [s for r in seen for s in r]
    assert got == {"method": "POST", "path_qs": "/v1/completions?x=1&y=/", "auth": "Bearer ht-secret",
                   "body": completion()}


def test_requests_sharing_a_prefix_reach_one_replica_and_new_prefixes_spread():
    async def scenario(client, router, url, replicas):
        for r in replicas:
            r.go.set()
        for prompt in ("A" * 300 + "1", "A" * 300 + "2", "B" * 300, "A" * 300 + "3", "C" * 300 + "?"):
            async with client.post(url + "/v1/completions", data=completion(prompt)) as resp:
                await resp.read()
        return [[json.loads(s["body"])["prompt"][0] for s in r.seen] for r in replicas], router.routed

    seen, routed = run(scenario)
    (a_side,) = [i for i, firsts in enumerate(seen) if "A" in firsts]
    assert seen[a_side].count("A") == 3 and "B" in seen[1 - a_side]  # A's three on one replica, B on the other
    assert sorted(routed.values()) == sorted(map(len, seen)) and sum(routed.values()) == 5


def test_a_replica_that_refuses_the_connection_is_retried_on_another_and_taken_out():
    dead = dead_url()

    async def scenario(client, router, url, replicas):
        replicas[0].go.set()
        statuses = []
        for i in range(3):
            async with client.post(url + "/v1/completions", data=completion(f"prompt {i} " * 40)) as resp:
                statuses.append((resp.status, await resp.read()))
        return statuses, router.table.down, router.retried, sum(router.table.in_flight.values())

    statuses, down, retried, in_flight = run(scenario, num_replicas=1, worker_urls=(dead,))
    assert statuses == [(200, b"data: first\n\ndata: [DONE]\n\n")] * 3
    assert down == {dead} and retried == 1 and in_flight == 0


def test_no_replica_answers_503():
    async def scenario(client, router, url, replicas):
        async with client.post(url + "/v1/completions", data=completion()) as resp:
            return resp.status, (await resp.json())["error"]["message"]

    assert run(scenario, num_replicas=0) == (503, "no replica could take the request")


def test_the_admin_api_adds_lists_and_removes_workers():
    async def scenario(client, router, url, replicas):
        calls = []
        for method, path in (("POST", "/add_worker?url=http%3A%2F%2F127.0.0.1%3A9"), ("GET", "/list_workers"),
                             ("POST", "/add_worker?url=http%3A%2F%2F127.0.0.1%3A9"),
                             ("POST", f"/remove_worker?url={replicas[0].url}"), ("GET", "/list_workers"),
                             ("POST", "/add_worker?url=ftp%3A%2F%2Fx")):
            async with client.request(method, url + path) as resp:
                calls.append((resp.status, await resp.json()))
        return calls, replicas[0].url, replicas[1].url

    calls, first, second = run(scenario)
    assert calls[0] == (200, {"url": "http://127.0.0.1:9", "changed": True})
    assert calls[1] == (200, {"urls": [first, second, "http://127.0.0.1:9"]})
    assert calls[2][1]["changed"] is False and calls[3] == (200, {"url": first, "changed": True})
    assert calls[4] == (200, {"urls": [second, "http://127.0.0.1:9"]})
    assert calls[5][0] == 400 and "http(s)://HOST:PORT" in calls[5][1]["error"]


def test_the_health_loop_takes_a_failing_replica_out_and_back_and_metrics_count():
    async def scenario(client, router, url, replicas):
        replicas[0].health = 503
        await router.check(replicas[0].url)
        once = set(router.table.down)
        await router.check(replicas[0].url)
        twice = set(router.table.down)
        replicas[0].health = 200
        await router.check(replicas[0].url)
        back = set(router.table.down)
        replicas[1].go.set()
        router.table.set_up(replicas[0].url, False)
        async with client.post(url + "/v1/completions", data=completion()) as resp:
            await resp.read()
        runner, metrics_url = await serve(metrics_app(router))
        async with client.get(metrics_url + "/metrics") as resp:
            text = await resp.text()
        await runner.cleanup()
        return once, twice, back, text, replicas[1].url

    once, twice, after, text, second = run(scenario, health_failure_threshold=2, health_check_interval_secs=60.0)
    assert once == set() and len(twice) == 1 and after == set()
    assert f'hosttune_router_requests_total{{worker="{second}"}} 1' in text
    assert f'hosttune_router_keys{{worker="{second}"}} 1' in text and "# TYPE hosttune_router_keys gauge" in text
    assert "hosttune_router_worker_up{" in text and "hosttune_router_retries_total 0" in text


def test_flags_parse_and_bad_ones_are_one_line_errors(capsys):
    config = parse_config(["--port", "8005", "--prefix-chars", "128", "--worker-urls", "http://h:1/", "http://h:2",
                           "--health-check-interval-secs", "2"])
    assert (config.port, config.prefix_chars, config.worker_urls, config.health_check_interval_secs) == (
        8005, 128, ("http://h:1", "http://h:2"), 2.0)
    for argv, message in ((["--prefix-chars", "0"], "--prefix-chars and --max-keys take a count of at least 1"),
                          (["--worker-urls", "h:1"], "--worker-urls takes http(s)://HOST:PORT, not 'h:1'"),
                          (["--policy", "cache_aware"], "invalid choice: 'cache_aware'")):
        with pytest.raises(SystemExit) as exit_:
            parse_config(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]


def test_a_client_that_leaves_mid_answer_stops_its_replica():
    async def scenario(client, router, url, replicas):
        resp = await client.post(url + "/v1/completions", data=completion())
        assert await resp.content.readany() == b"data: first\n\n"
        in_flight = sum(router.table.in_flight.values())
        resp.close()  # the client goes away with the replica still generating
        for _ in range(100):
            if not sum(router.table.in_flight.values()) and sum(r.cancelled for r in replicas):
                break
            await asyncio.sleep(0.02)
        return in_flight, sum(router.table.in_flight.values()), sum(r.cancelled for r in replicas)

    assert run(scenario) == (1, 0, 1)
