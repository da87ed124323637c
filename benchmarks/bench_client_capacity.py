"""How many concurrent streams can `hosttune bench`'s client keep without falling behind?

Method: a scripted server (tests/support/scripted_server, `--fast`) in its own process on
127.0.0.1 streams every token of every request on a shared 20 ms clock tick, the way a
batched decode step emits one token for every running sequence at once: at 512 streams,
512 chunks land on the client in the same instant, 50 times a second. The client runs
closed-loop users (one stream each) through the real `measure()` path, and we report:

- the client's event-loop lag (how late a 5 ms timer fired: P50, P99, max) and its CPU;
- "tick delay": for every chunk, its arrival time minus the tick it was sent on (both
  on CLOCK_MONOTONIC), P50 and P99; this bounds the error of every TTFT/ITL timestamp
  and includes the server's own lateness in writing 512 chunks;
- whether bench flagged the run (lag P99 over 5 ms).

A second server sends tokens on each request's own timers instead of shared ticks
(no bursts), at the largest stream count. As a baseline, the ticked load through a
plain aiohttp streaming client (a coroutine
woken per chunk), the usual way of writing such a client.

Run: python benchmarks/bench_client_capacity.py [--streams 128,256,512,1024] [--duration 10] [--out FILE]
All traffic goes to 127.0.0.1; every run is bounded in time. --out writes the rows as JSON with the date,
the commit and the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

if not __package__:  # run as a file: this checkout's packages
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from benchmarks.engine.common import head_commit  # noqa: E402
from hosttune.bench.benchmark import BenchSpec, measure, run_async  # noqa: E402
from hosttune.bench.loadgen import LAG_INTERVAL, Load  # noqa: E402
from hosttune.bench.metrics import percentile, summarize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from scripted_server import launch  # noqa: E402  (test support, not part of the package)

STEP = 0.02  # seconds between decode ticks
TOKENS = 64  # output tokens per request


def start_server(is_ticked: bool, is_realtime: bool) -> tuple[subprocess.Popen, str]:
    args = ["--fast", "--ttft", "0.02", "--itl", str(STEP)] + (["--step", str(STEP)] if is_ticked else [])
    return launch.start(*args, *(["--realtime"] if is_realtime else []), lifetime=900,
                        preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if is_realtime else None)


def tick_delays(chunk_times: list[float]) -> list[float]:
    """Arrival minus the tick the chunk was sent on (the last multiple of STEP)."""
    return [t - math.floor(t / STEP) * STEP for t in chunk_times]


def run_bench_client(url: str, streams: int, duration: float, warmup: float,
                     is_ticked: bool = True) -> dict:
    spec = BenchSpec(load=Load(users=streams, duration=duration, warmup=warmup, drain_timeout=30),
                     prompt_lengths="16", output_lengths=str(TOKENS), timeout=60)
    run = run_async(measure(spec, url))
    summary = summarize(run)
    start, stop = run.window
    chunks = [run.clock_origin + t for r in run.requests for t in r.chunks if start <= t <= stop]
    delays = tick_delays(chunks) if is_ticked else [math.nan]
    return {
        "client": "hosttune bench" + ("" if is_ticked else " (tokens not on ticks)"),
        "streams": streams, "chunks_per_s": len(chunks) / (stop - start),
        "cpu": summary.lag.cpu, "lag_p50": summary.lag.loop_p50, "lag_p99": summary.lag.loop_p99,
        "lag_max": summary.lag.loop_max, "delay_p50": percentile(delays, 50),
        "delay_p99": percentile(delays, 99), "flagged": summary.lag.is_behind,
        "ok": summary.num_ok, "failed": summary.num_failed + summary.num_rejected,
    }


async def _aiohttp_load(url: str, streams: int, duration: float, warmup: float) -> dict:
    """The baseline: aiohttp, one coroutine per stream, timestamp per chunk read."""
    loop_lag, chunks, stop_at = [], [], time.perf_counter() + warmup + duration
    measure_from = time.perf_counter() + warmup
    body = {"model": "scripted", "prompt": "the " * 15, "max_tokens": TOKENS, "stream": True}

    async def user(session):
        while time.perf_counter() < stop_at:
            async with session.post(url + "/v1/completions", json=body) as resp:
                async for _ in resp.content.iter_any():
                    now = time.perf_counter()
                    if measure_from <= now <= stop_at:
                        chunks.append(now)

    async def lag_probe():
        while True:
            due = time.perf_counter() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            now = time.perf_counter()
            if measure_from <= now <= stop_at:
                loop_lag.append(max(0.0, now - due))

    cpu0, wall0 = time.process_time(), time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        probe = asyncio.create_task(lag_probe())
        await asyncio.gather(*(user(session) for _ in range(streams)))
        probe.cancel()
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    delays = tick_delays(chunks)
    return {
        "client": "aiohttp baseline", "streams": streams, "chunks_per_s": len(chunks) / duration,
        "cpu": cpu, "lag_p50": percentile(loop_lag, 50), "lag_p99": percentile(loop_lag, 99),
        "lag_max": max(loop_lag), "delay_p50": percentile(delays, 50),
        "delay_p99": percentile(delays, 99), "flagged": percentile(loop_lag, 99) > 0.005,
        "ok": None, "failed": None,
    }


def run_aiohttp_client(url: str, streams: int, duration: float, warmup: float) -> dict:
    return run_async(_aiohttp_load(url, streams, duration, warmup))


def environment() -> str:
    import aiohttp as _aiohttp

    try:
        import uvloop
        loop = f"uvloop {uvloop.__version__}"
    except ImportError:
        loop = "asyncio (no uvloop)"
    return (f"python {platform.python_version()}, aiohttp {_aiohttp.__version__}, {loop}, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")


def row(result: dict) -> str:
    ms = lambda x: "-" if math.isnan(x) else f"{x * 1e3:.2f}"  # noqa: E731
    return (f"| {result['client']} | {result['streams']} | {result['chunks_per_s']:,.0f} | "
            f"{result['cpu']:.2f} | {ms(result['lag_p50'])} / {ms(result['lag_p99'])} / "
            f"{ms(result['lag_max'])} | {ms(result['delay_p50'])} / {ms(result['delay_p99'])} | "
            f"{'yes' if result['flagged'] else 'no'} |")


def record(args: argparse.Namespace, environment_line: str, results: list[dict]) -> dict:
    """The run as JSON: NaN (no tick delays when tokens are not on ticks) as null."""
    clean = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in results]
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": head_commit(), "environment": environment_line, "realtime": args.realtime,
            "duration_s": args.duration, "warmup_s": args.warmup, "load_average_after": os.getloadavg()[0],
            "results": clean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="128,256,512,1024")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--realtime", action="store_true",
                        help="pin server and client to a core each at SCHED_FIFO priority, so other "
                             "processes on a shared machine do not preempt them (needs root)")
    parser.add_argument("--out", type=Path, help="the rows as JSON")
    args = parser.parse_args()
    if args.realtime:
        os.sched_setaffinity(0, {os.cpu_count() - 1})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    environment_line = environment() + (", server and client pinned at SCHED_FIFO" if args.realtime else "")
    print(environment_line, flush=True)
    counts = [int(s) for s in args.streams.split(",")]
    results = []
    for is_ticked in (True, False):
        process, url = start_server(is_ticked, args.realtime)
        try:
            for streams in counts if is_ticked else [max(counts)]:
                results.append(run_bench_client(url, streams, args.duration, args.warmup, is_ticked))
                print(row(results[-1]), flush=True)
                if is_ticked and not args.no_baseline:
                    results.append(run_aiohttp_client(url, streams, args.duration, args.warmup))
                    print(row(results[-1]), flush=True)
        finally:
            launch.stop(process, timeout=10)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    print("| client | streams | chunks/s | client CPU (cores) | loop lag P50 / P99 / max (ms) "
          "| tick delay P50 / P99 (ms) | flagged |")
    print("|---|---|---|---|---|---|---|")
    for result in results:
        print(row(result))
    if args.out:
        args.out.write_text(json.dumps(record(args, environment_line, results), indent=1) + "\n")


if __name__ == "__main__":
    main()
