#!/usr/bin/env python3
"""Tail latency of the engine server under production-shaped streaming traffic: fixed 8,192-token
prefill chunks ("old", --max-step-ms off) against the step time budget ("new", --max-step-ms auto, the default),
side by side in one run on one GPU, Qwen2.5-7B shape with bf16 dummy weights.

For each setting it starts `python -m hosttune_engine serve` (prefix caching off, so that chance
repeats of a prompt's start cannot flatter either), records the time to /health 200, then drives it
with `hosttune bench`'s load generator: 64 closed-loop streaming users, the default length mix
(30% 32-512 tokens, 70% normal around 4,200, 512 out), 20 s of warm-up and 60 s measured, the
server's /metrics sampled every second. Then the priority scenario: a high-priority open-loop stream
(priority 0, at a quarter of the users' request rate, so 20% of requests) alone, then beside the 64
low-priority users (priority 10); its TTFT P95 loaded over idle is the figure. Each server keeps a
step log (--step-log): results.json sums up its steps in each phase (how many held prompt tokens, their
real times, the budget's correction). Writes OUT/results.json (after every phase), each run's bench
outputs and step log under OUT/<setting>/, and prints a table last.

Example (H200): python benchmarks/engine/tail_latency.py --out $OUT
CPU dry run (a tiny model): python benchmarks/engine/tail_latency.py --out /tmp/tail --small
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.qwen25_7b import QWEN25_7B  # noqa: E402

from hosttune.bench import plot, report, report_csv  # noqa: E402
from hosttune.bench.benchmark import BenchSpec, measure  # noqa: E402
from hosttune.bench.loadgen import Load  # noqa: E402
from hosttune.bench.metrics import percentile, summarize  # noqa: E402
from hosttune.bench.prompts import FALLBACK_WORDS, WORDS  # noqa: E402

SETTINGS = {"new": ["--max-step-ms", "auto"], "old": ["--max-step-ms", "off"]}
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 1, "vocab_size": 2048, "eos_token_id": 2000}
LOW, HIGH = 10, 0  # request priorities: lower runs first


def write_model(folder: Path, small: bool) -> Path:
    """config.json and a word-level tokenizer whose first ids are bench's prompt words (so prompts are
    distinct texts of exact lengths); the rest of the vocabulary is "t<id>"."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = {**QWEN25_7B, **(SMALL if small else {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    words = list(dict.fromkeys(WORDS + FALLBACK_WORDS))
    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({f"t{i}": i for i in range(len(words), cfg["vocab_size"])})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": f"t{cfg['eos_token_id']}"}))
    return folder


def start_server(folder: Path, log: Path, small: bool, flags: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "hosttune_engine", "serve", "--model", str(folder), "--load-format", "dummy",
            "--port", "0", "--served-model-name", "qwen7b-dummy", "--no-enable-prefix-caching",
            "--max-num-batched-tokens", "8192", *flags]
    args += ["--device", "cpu", "--max-model-len", "1024"] if small else ["--dtype", "bfloat16", "--max-model-len", "8192"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO / 'engine'}:{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def wait_healthy(proc: subprocess.Popen, log: Path, timeout: float) -> tuple[str, float]:
    """The server's URL and the seconds from start to /health 200."""
    start, url = time.monotonic(), None
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if url is None:
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = found.group(1) if found else None
        elif _health(url) == 200:
            return url, time.monotonic() - start
        time.sleep(0.1)
    raise TimeoutError(f"server not healthy in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


FIRST_LENGTHS = (37, 700, 1500, 4100, 6000)  # prompt tokens of the requests timed right after /health 200
SMALL_FIRST_LENGTHS = (12, 100, 400)


def first_ttfts(url: str, small: bool) -> list[float]:
    """TTFT in ms of one streaming request per prompt length, one after another on the idle server: right
    after /health 200 they show whether warmup left a shape class to compile; after the traffic, the warm
    level."""
    rng = random.Random(3)
    words = list(dict.fromkeys(WORDS))
    result = []
    for n in SMALL_FIRST_LENGTHS if small else FIRST_LENGTHS:
        body = json.dumps({"model": "qwen7b-dummy", "prompt": " ".join(rng.choices(words, k=n)), "max_tokens": 4,
                           "stream": True, "ignore_eos": True}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        start = time.monotonic()
        with urllib.request.urlopen(request, timeout=120) as response:
            for line in response:
                if line.startswith(b"data: {") and b'"text":""' not in line.replace(b" ", b""):
                    result.append(round((time.monotonic() - start) * 1e3, 1))
                    break
            response.read()
    return result


def spec(args, load: Load, priority: int | None = None) -> BenchSpec:
    return BenchSpec(load=load, prompt_lengths=args.prompts, output_lengths=str(args.max_tokens),
                     timeout=120, priority=priority)


def users_load(args, duration: float) -> Load:
    return Load(users=args.users, duration=duration, warmup=args.warmup, drain_timeout=15, seed=1)


def stream_load(args, rate: float, duration: float) -> Load:
    return Load(rate=rate, duration=duration, warmup=args.warmup, drain_timeout=15, seed=2)


def numbers(summary) -> dict:
    def ms(stats, q):
        return None if stats is None else round(stats.at(q) * 1e3, 2)
    return {"requests": summary.num_requests, "ok": summary.num_ok, "errors": summary.num_failed + summary.num_rejected,
            "itl_p50_ms": ms(summary.itl, 50), "itl_p99_ms": ms(summary.itl, 99),
            "ttft_p50_ms": ms(summary.ttft, 50), "ttft_p95_ms": ms(summary.ttft, 95),
            "tpot_p50_ms": ms(summary.tpot, 50), "e2e_p95_ms": ms(summary.e2e, 95),
            "output_tok_s": round(summary.output_token_throughput, 1),
            "streamed_tok_s": round(summary.streamed_token_throughput, 1),
            "request_s": round(summary.request_throughput, 3), "client_behind": summary.lag.is_behind}


def write_bench(folder: Path, runs, command: str) -> None:
    """hosttune bench's own outputs for these runs: JSON, CSV, Markdown and (with matplotlib) plots."""
    folder.mkdir(parents=True, exist_ok=True)
    outcome = report.Outcome(tuple(runs), (), command)
    report.write_json(outcome, folder / "results.json")
    report_csv.write_csv(outcome, folder)
    try:
        names = plot.write_plots(list(runs), [], folder)
    except ImportError:
        names = []
    report.write_markdown(outcome, folder / "report.md", names)


def step_summary(path: Path, start: float, end: float) -> dict | None:
    """The server's steps between two `time.monotonic()` readings (its --step-log): how many held
    prompt tokens, their real times against the decode-only ones, and the step budget's correction."""
    if not path.is_file():
        return None
    steps = [r for r in map(json.loads, path.read_text().splitlines()) if start <= r["t"] <= end and r["ms"]]
    mixed = [r for r in steps if r["decodes"] and r["prefill_tokens"]]
    plain = [r for r in steps if not r["prefill_tokens"]]

    def q(rows, p):
        return round(percentile([r["ms"] for r in rows], p), 2) if rows else None
    ratios = [r["ms"] / r["estimate_ms"] for r in mixed if r["estimate_ms"]]
    return {"steps": len(steps), "mixed_share": round(len(mixed) / len(steps), 3) if steps else None,
            "mixed_ms_p50": q(mixed, 50), "mixed_ms_p99": q(mixed, 99), "decode_ms_p50": q(plain, 50),
            "decode_ms_p99": q(plain, 99), "all_ms_p99": q(steps, 99),
            "prefill_tokens_per_mixed_step": round(sum(r["prefill_tokens"] for r in mixed) / len(mixed), 1)
            if mixed else None,
            "real_over_estimate_p50": round(percentile(ratios, 50), 3) if ratios else None,
            "scale_last": steps[-1]["scale"] if steps else None}


async def traffic(args, url: str, out: Path) -> dict:
    run = await measure(spec(args, users_load(args, args.duration)), url)
    summary = summarize(run)
    write_bench(out / "traffic", [(run, summary)], f"{args.users} users, {args.prompts}, {args.max_tokens} out")
    samples = [s for s in run.server_metrics if run.window[0] <= s.at <= run.window[1]]
    waiting = [s.waiting for s in samples if s.waiting is not None]
    return {**numbers(summary), "server_waiting_max": max(waiting, default=None),
            "server_preemptions": (samples[-1].preemptions - samples[0].preemptions) if len(samples) > 1
            and samples[0].preemptions is not None else None}


async def priority(args, url: str, rate: float, out: Path) -> dict:
    idle_run = await measure(spec(args, stream_load(args, rate, args.priority_duration), HIGH), url)
    low_spec = spec(args, users_load(args, args.priority_duration), LOW)
    high_spec = spec(args, stream_load(args, rate, args.priority_duration), HIGH)
    low_run, high_run = await asyncio.gather(measure(low_spec, url), measure(high_spec, url))
    runs = {"high_idle": idle_run, "high_loaded": high_run, "low_loaded": low_run}
    summaries = {name: summarize(run) for name, run in runs.items()}
    for name, run in runs.items():
        write_bench(out / f"priority-{name}", [(run, summaries[name])], f"priority scenario: {name}")
    result = {name: numbers(s) for name, s in summaries.items()}
    idle, loaded = result["high_idle"]["ttft_p95_ms"], result["high_loaded"]["ttft_p95_ms"]
    result.update(rate=round(rate, 3), high_ttft_p95_ratio=round(loaded / idle, 3) if idle and loaded else None)
    return result


def run_setting(args, name: str, folder: Path, out: Path, results: dict, rate: float | None) -> float | None:
    """One server: traffic, then the priority scenario if time allows; returns the users' request rate."""
    setting_out = out / name
    setting_out.mkdir(parents=True, exist_ok=True)
    log = setting_out / "server.log"
    proc = start_server(folder, log, args.small, [*SETTINGS[name], "--step-log", str(setting_out / "steps.jsonl")])
    entry = results.setdefault("settings", {}).setdefault(name, {"flags": SETTINGS[name]})
    try:
        url, healthy = wait_healthy(proc, log, args.ready_timeout)
        entry["seconds_to_healthy"] = round(healthy, 1)
        entry["step_budget_log"] = [line.split(": ", 1)[-1] for line in log.read_text().splitlines() if "step budget" in line]
        entry["first_ttft_ms"] = {"prompt_tokens": list(SMALL_FIRST_LENGTHS if args.small else FIRST_LENGTHS),
                                  "after_healthy": first_ttfts(url, args.small)}
        start = time.monotonic()
        entry["traffic"] = asyncio.run(traffic(args, url, setting_out))
        entry["traffic_steps"] = step_summary(setting_out / "steps.jsonl", start + args.warmup, time.monotonic())
        entry["first_ttft_ms"]["warm"] = first_ttfts(url, args.small)
        _save(out, results)
        rate = rate or entry["traffic"]["request_s"] / 4  # the high stream: 20% of all requests
        needed = 2 * (args.priority_duration + args.warmup) + 40
        if rate > 0 and time.monotonic() + needed < args.deadline:
            start = time.monotonic()
            entry["priority"] = asyncio.run(priority(args, url, rate, setting_out))
            entry["priority_steps"] = step_summary(setting_out / "steps.jsonl", start, time.monotonic())
        else:
            entry["priority"] = "skipped: not enough time left in the run's budget"
        _save(out, results)
        return rate
    finally:
        stop(proc)


def _save(out: Path, results: dict) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


def table(results: dict) -> str:
    settings = results.get("settings", {})
    head = f"{'setting':8} {'healthy s':>9} {'ITL p50':>8} {'ITL p99':>8} {'p99/p50':>7} {'TTFT p50':>9} " \
           f"{'TTFT p95':>9} {'out tok/s':>9} {'streamed':>9} {'requests':>8} {'prio p95 x':>10}"
    lines = [head, "-" * len(head)]
    for name, entry in settings.items():
        t = entry.get("traffic") or {}
        p = entry.get("priority")
        ratio = p.get("high_ttft_p95_ratio") if isinstance(p, dict) else None
        itl = (t.get("itl_p99_ms") or 0) / t["itl_p50_ms"] if t.get("itl_p50_ms") else None
        lines.append(f"{name:8} {entry.get('seconds_to_healthy', '-'):>9} {_f(t.get('itl_p50_ms'))} "
                     f"{_f(t.get('itl_p99_ms'))} {_f(itl, 7, 2)} {_f(t.get('ttft_p50_ms'), 9)} "
                     f"{_f(t.get('ttft_p95_ms'), 9)} {_f(t.get('output_tok_s'), 9)} {_f(t.get('streamed_tok_s'), 9)} "
                     f"{t.get('requests', '-'):>8} "
                     f"{_f(ratio, 10, 2)}")
    old, new = (settings.get(n, {}).get("traffic") or {} for n in ("old", "new"))
    if old.get("streamed_tok_s") and new.get("streamed_tok_s"):
        streamed = new["streamed_tok_s"] / old["streamed_tok_s"]
        lines.append(f"throughput new/old: streamed {streamed:.3f} (target >= 0.95), finished in the window "
                     f"{new['output_tok_s'] / old['output_tok_s']:.3f}; "
                     "targets: ITL p99 <= 3x p50, TTFT p95 <= 1000 ms, priority p95 loaded/idle <= 1.5")
    return "\n".join(lines)


def _f(value, width: int = 8, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "tail-latency-out"))
    parser.add_argument("--small", action="store_true", help="a tiny model on CPU, short runs: dry-run the script")
    parser.add_argument("--users", type=int)
    parser.add_argument("--duration", type=float, help="measured seconds of the traffic runs (60; --small 4)")
    parser.add_argument("--priority-duration", type=float, help="seconds of each priority run (30; --small 3)")
    parser.add_argument("--warmup", type=float,
                        help="warm-up seconds before each measured run (20; --small 1): the users all start at once, "
                             "so their first requests, about 10 s long on an H200, end together and the next ones "
                             "arrive as one burst, a start-up transient that the warm-up covers")
    parser.add_argument("--max-step-ms", default="auto", help="the new setting's step budget (auto or milliseconds)")
    parser.add_argument("--budget-s", type=float, default=520, help="the priority scenario is skipped past this")
    parser.add_argument("--ready-timeout", type=float, default=240)
    parser.add_argument("--settings", default="new,old", help="which servers run, in order (new, old or both)")
    args = parser.parse_args()
    small = args.small
    args.users = args.users or (4 if small else 64)
    args.duration = args.duration or (4.0 if small else 60.0)
    args.priority_duration = args.priority_duration or (3.0 if small else 30.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if small else 20.0)
    args.prompts = "mix:0.3*uniform:8-32+0.7*normal:200,40,100-400" if small else "chat-docs"
    args.max_tokens = 16 if small else 512
    args.deadline = time.monotonic() + args.budget_s
    SETTINGS["new"] = ["--max-step-ms", args.max_step_ms]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = write_model(Path(tempfile.mkdtemp(prefix="tail-latency-model-")), small)
    results = {"model": "Qwen2.5-7B shape, bf16 dummy weights" if not small else "tiny, CPU", "users": args.users,
               "prompts": args.prompts, "max_tokens": args.max_tokens, "duration_s": args.duration,
               "priority_duration_s": args.priority_duration}
    rate = None
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    if not names or any(n not in SETTINGS for n in names):
        parser.error(f"--settings: a comma-separated list of {', '.join(SETTINGS)}")
    for name in names:
        rate = run_setting(args, name, folder, out, results, rate)
    _save(out, results)
    print(table(results))


if __name__ == "__main__":
    main()
