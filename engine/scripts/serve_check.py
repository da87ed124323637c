#!/usr/bin/env python3
"""Start `hosttune-engine serve` on a Qwen2.5-7B-shaped dummy model and drive it over HTTP (127.0.0.1 only).

Measures: time to /health 200 (load + warmup) and the phases /health reported on the way; single
completions whole and streamed (greedy: same text), TTFT and inter-token latency; a chat stream; a
4K-token prompt's TTFT; 64 concurrent streams (output tokens/s); a burst of 240 requests against
--max-batch-size 64 --max-queue 16 (only 200s and 429s, 429 latency); /health and /metrics under load;
SIGTERM with requests in flight (drain, exit code). Writes result.json and prints a Markdown table.

The model folder gets config.json and a word-level tokenizer over the whole vocabulary ("t0" ... "t152063"),
so text prompts, chat and streamed text work on random weights. `--small` shrinks the model for a CPU
dry run of this script.

Example: python engine/scripts/serve_check.py --out /tmp/serve-check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.engine.qwen25_7b import QWEN25_7B  # noqa: E402  (shared with the benchmarks)

SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 1, "vocab_size": 4096, "eos_token_id": 4000}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}" \
                "assistant{% endif %}"
SIZES = {"batch": 64, "queue": 16, "burst": 240}  # --small: 4, 4, 24


def write_model(folder: Path, small: bool) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = {**QWEN25_7B, **(SMALL if small else {})}
    VOCAB[0] = cfg["vocab_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    vocab = {f"t{i}": i for i in range(cfg["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": f"t{cfg['eos_token_id']}", "chat_template": CHAT_TEMPLATE}))
    return folder


VOCAB = [QWEN25_7B["vocab_size"]]  # set by write_model


def words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    return " ".join(f"t{rng.randrange(1, VOCAB[0] - 100)}" for _ in range(n))


# -- client ----------------------------------------------------------------------------------
async def stream(session, url, path, body):
    """(status, text, ttft, inter-token gaps, finish reasons, wall) of one streamed request."""
    t0 = time.perf_counter()
    times, text, reasons = [], "", []
    async with session.post(url + path, json={**body, "stream": True}) as r:
        if r.status != 200:
            await r.read()
            return r.status, "", None, [], [], time.perf_counter() - t0
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            for c in chunk["choices"]:
                piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter())
                    text += piece
                if c.get("finish_reason"):
                    reasons.append(c["finish_reason"])
    gaps = [b - a for a, b in zip(times, times[1:])]
    return 200, text, (times[0] - t0) if times else None, gaps, reasons, time.perf_counter() - t0


async def whole(session, url, body):
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as r:
        payload = await r.json(content_type=None)
        return r.status, payload, time.perf_counter() - t0


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else None


async def drive(url: str, proc: subprocess.Popen, result: dict) -> None:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=400)) as s:
        prompt = words(512, 1)
        body = {"prompt": prompt, "max_tokens": 128, "temperature": 0, "ignore_eos": True}
        status, payload, wall = await whole(s, url, body)
        result["single_whole"] = {"status": status, "seconds": round(wall, 3),
                                  "tokens": payload.get("usage", {}).get("completion_tokens")}
        st, text, ttft, gaps, reasons, wall = await stream(s, url, "/v1/completions", body)
        result["single_stream"] = {"status": st, "ttft_ms": ms(ttft), "itl_p50_ms": ms(pct(gaps, 0.5)),
                                   "itl_p99_ms": ms(pct(gaps, 0.99)), "seconds": round(wall, 3),
                                   "same_text_as_whole": text == payload["choices"][0]["text"]}
        chat = {"messages": [{"role": "user", "content": words(64, 2)}], "max_tokens": 32, "temperature": 0}
        st, text, ttft, gaps, reasons, _ = await stream(s, url, "/v1/chat/completions", chat)
        result["chat_stream"] = {"status": st, "ttft_ms": ms(ttft), "chunks": len(gaps) + 1, "finish": reasons}
        st, _, ttft, _, _, _ = await stream(s, url, "/v1/completions",
                                            {"prompt": words(4096, 3), "max_tokens": 1, "temperature": 0})
        result["prompt_4k"] = {"status": st, "ttft_ms": ms(ttft)}
        await concurrency(s, url, result)
        await burst(s, url, result)
        await sigterm(s, url, proc, result)


async def concurrency(s, url, result):
    body = {"max_tokens": 128, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    runs = await asyncio.gather(*(stream(s, url, "/v1/completions", {**body, "prompt": words(256, 100 + i)})
                                  for i in range(SIZES["batch"])))
    wall = time.perf_counter() - t0
    async with s.get(url + "/health") as r:
        result["health_after_load"] = await r.json()
    ttfts = [r[2] for r in runs if r[2] is not None]
    gaps = [g for r in runs for g in r[3]]
    result["concurrent"] = {"streams": SIZES["batch"], "statuses": sorted({r[0] for r in runs}),
                            "seconds": round(wall, 2), "output_tok_s": round(SIZES["batch"] * 128 / wall), "ttft_p50_ms": ms(pct(ttfts, 0.5)),
                            "itl_p50_ms": ms(pct(gaps, 0.5)), "itl_p99_ms": ms(pct(gaps, 0.99))}


async def burst(s, url, result):
    body = {"prompt": words(128, 5), "max_tokens": 64, "temperature": 0, "ignore_eos": True}
    results = await asyncio.gather(*(whole(s, url, body) for _ in range(SIZES["burst"])))
    lat429 = [t for st, _, t in results if st == 429]
    counts = {}
    for st, _, _ in results:
        counts[st] = counts.get(st, 0) + 1
    result["burst"] = {"requests": SIZES["burst"], "statuses": counts, "429_p50_ms": ms(pct(lat429, 0.5)),
                       "429_p95_ms": ms(pct(lat429, 0.95)), "429_max_ms": ms(max(lat429, default=None))}
    # One client asking while the server is full: the 429 as a client behind a load balancer sees it.
    fill = [asyncio.create_task(whole(s, url, {**body, "max_tokens": 200})) for _ in range(SIZES["batch"] + SIZES["queue"])]
    await asyncio.sleep(1.0)
    probes = []
    for _ in range(50):
        st, _, t = await whole(s, url, {"prompt": "t1 t2", "max_tokens": 2})
        probes.append((st, t))
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    await asyncio.gather(*fill)
    lat = [t for st, t in probes if st == 429]
    result["probe_429_when_full"] = {"statuses": sorted({st for st, _ in probes}), "p50_ms": ms(pct(lat, 0.5)),
                                     "p95_ms": ms(pct(lat, 0.95))}
    result["metrics_sample"] = {m: metric(text, m) for m in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count")}
    result["metrics_sample"]["rejected_overload"] = metric(text, "vllm:num_requests_rejected_total",
                                                           'reason="overload"')


async def sigterm(s, url, proc, result):
    body = {"prompt": words(64, 9), "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    tasks = [asyncio.create_task(stream(s, url, "/v1/completions", body)) for _ in range(SIZES["queue"])]
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.05)
    async with s.get(url + "/health") as r:
        health = r.status
    runs = await asyncio.gather(*tasks)
    code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 60)
    result["sigterm"] = {"health_after": health, "in_flight_statuses": sorted({r[0] for r in runs}),
                         "finish": sorted({f for r in runs for f in r[4]}), "exit_code": code,
                         "seconds_to_exit": round(time.perf_counter() - t0, 2)}


def metric(text: str, name: str, label: str = "") -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def ms(seconds):
    return None if seconds is None else round(seconds * 1e3, 2)


# -- server ------------------------------------------------------------------------------------
def start_server(model: Path, log_path: Path, small: bool) -> subprocess.Popen:
    args = [sys.executable, "-m", "hosttune_engine", "serve", "--model", str(model), "--load-format", "dummy",
            "--port", "0", "--max-batch-size", str(SIZES["batch"]), "--max-queue", str(SIZES["queue"]),
            "--max-model-len", "8192",
            "--num-kv-blocks", "8192", "--shutdown-timeout", "30"]
    args += ["--device", "cpu"] if small else ["--dtype", "bfloat16"]
    return subprocess.Popen(args, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_ready(proc, log_path: Path, deadline_s: float, result: dict) -> str | None:
    t0, url, phases = time.monotonic(), None, []
    while time.monotonic() - t0 < deadline_s and proc.poll() is None:
        if url is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text())
            url = m.group(1) if m else None
            if url:
                result["seconds_to_listen"] = round(time.monotonic() - t0, 2)
        else:
            import urllib.request, urllib.error

            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    code, status = r.status, json.loads(r.read())["status"]
            except urllib.error.HTTPError as e:
                code, status = e.code, json.loads(e.read())["status"]
            if not phases or phases[-1][1] != status:
                phases.append((code, status, round(time.monotonic() - t0, 2)))
            if code == 200:
                result["health_phases"] = phases
                return url
        time.sleep(0.05)
    result["health_phases"] = phases
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="a tiny model on CPU: dry-run the script")
    parser.add_argument("--ready-timeout", type=float, default=150)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"small": args.small}
    if args.small:
        SIZES.update(batch=4, queue=4, burst=24)
    model = write_model(Path(tempfile.mkdtemp()), args.small)
    log_path = out / "server.log"
    proc = start_server(model, log_path, args.small)
    try:
        url = wait_ready(proc, log_path, args.ready_timeout, result)
        if url:
            asyncio.run(drive(url, proc, result))
        else:
            result["error"] = "server never became healthy"
    except Exception as e:
        result["error"] = repr(e)
    finally:
        if proc.poll() is None:
            proc.kill()
        (out / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        print(log_path.read_text()[-3000:])


if __name__ == "__main__":
    main()
