"""Priority through HTTP: with the batch full, a higher-priority request (lower value, as in vLLM)
takes the next free slot ahead of lower-priority requests that arrived before it."""

import asyncio
import json
import time

import aiohttp

from .harness import post, wait_idle


async def _run(url):
    done = {}

    async def ask(name, max_tokens, priority=0):
        body = {"prompt": "The quick brown fox", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "priority": priority}
        async with session.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()
        done[name] = time.monotonic()

    async def wait_for(running, queued):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            async with session.get(url + "/health") as r:
                body = await r.json()
            if body["running"] == running and body["queued"] == queued:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never saw running={running} queued={queued}: {body}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(ask("short-running", 40))]
        tasks += [asyncio.create_task(ask(f"long-{i}", 150)) for i in range(3)]
        await wait_for(4, 0)
        tasks += [asyncio.create_task(ask(f"low-{i}", 4, priority=5)) for i in range(3)]
        await wait_for(4, 3)
        tasks.append(asyncio.create_task(ask("high", 4, priority=-5)))
        await asyncio.gather(*tasks)
    return done


def test_higher_priority_takes_the_next_free_slot(server):
    done = asyncio.run(_run(server.url))
    assert done["high"] < min(done[f"low-{i}"] for i in range(3)), done
    wait_idle(server)


def test_default_max_tokens_fits_what_the_context_leaves(server):
    status, _, raw = post(server.url + "/v1/completions",
                          {"prompt": [7] * 1020, "temperature": 0, "ignore_eos": True})
    body = json.loads(raw)
    assert status == 200 and body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["finish_reason"] == "length"
