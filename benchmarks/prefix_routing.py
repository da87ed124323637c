"""Requests that share a prefix, routed by prefix or by load: output throughput, TTFT and the replicas'
prefix-cache hit rate, the two fronts one after the other in one run.

Two ways to get the replicas:

    # on one GPU box: N replicas of the engine on this machine's GPU(s), each with its share of memory,
    # hosttune's prefix router (from a Python that has aiohttp) in front of them, by prefix then by load
    python benchmarks/prefix_routing.py bare --model /models/qwen2.5-7b --replicas 4 --load-format dummy \\
        --router-python /opt/hosttune/current/bin/python --out benchmarks/results/prefix_routing.json

    # a host deployed by hosttune: `hosttune deploy --router`, bench, `hosttune deploy --no-router`, bench
    python benchmarks/prefix_routing.py deploy -i inventory.yaml --url http://gpu-01:8000 --api-key-file KEY

Workload (the defaults): 64 system prompts of 4,000 tokens, each shared by 2 closed-loop users (128 users),
questions of 128 tokens, 64 output tokens, 10 s of warm-up then 15 s measured. The replicas come up fresh for
each front (bare: restarted; deploy: a rolling restart), so each starts with cold caches. The hit rate is
the replicas' own counters (bare: all of them; deploy: the one replica behind the front that answers
/metrics).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: this checkout's packages
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "engine")]

from hosttune.bench.benchmark import BenchSpec, measure, run_async  # noqa: E402
from hosttune.bench.loadgen import Load  # noqa: E402
from hosttune.bench.metrics import prefix_hit_rate, summarize  # noqa: E402
from hosttune.deploy.settings import flag_argv  # noqa: E402
from hosttune.presets import load_router  # noqa: E402

POLICIES = ("prefix_affinity", "least_in_flight")  # bare: the router's two policies; deploy: --router, --no-router
SCRIPTS = Path(__file__).resolve().parents[1] / "hosttune" / "deploy"  # the router's, as deploy ships them


@dataclass(frozen=True)
class Workload:
    prefixes: int = 64
    users_per_prefix: int = 2
    prefix_tokens: int = 4000
    question_tokens: int = 128
    max_tokens: int = 64
    warmup_s: float = 10.0
    duration_s: float = 15.0

    def spec(self, headers: tuple[tuple[str, str], ...] = (), tokenizer: Path | None = None) -> BenchSpec:
        load = Load(users=self.prefixes * self.users_per_prefix, duration=self.duration_s, warmup=self.warmup_s)
        return BenchSpec(load=load, shared_prefix=(self.prefixes, self.users_per_prefix), prefix_tokens=self.prefix_tokens,
                         prompt_lengths=str(self.question_tokens), output_lengths=str(self.max_tokens),
                         timeout=600.0, lag_limit=1.0, headers=headers, tokenizer=tokenizer)


@dataclass(frozen=True)
class FrontResult:
    front: str
    requests_ok: int
    requests_failed: int
    request_throughput: float
    output_token_throughput: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    prefix_hit_rate: float | None  # the replicas' prompt tokens found in their prefix caches, over those looked up


def result_of(front: str, run, hit_rate: float | None) -> FrontResult:
    s = summarize(run)
    ms = (lambda q: None if s.ttft is None else round(s.ttft.at(q) * 1e3, 1))
    return FrontResult(front, s.num_ok, s.num_failed, round(s.request_throughput, 2),
                       round(s.output_token_throughput, 1), ms(50), ms(95),
                       None if hit_rate is None else round(hit_rate, 3))


def replica_argv(python: str, model: str, port: int, memory_share: float, extra: list[str]) -> list[str]:
    """One replica of the bundled engine on 127.0.0.1, prefix caching on, with its share of the GPU's memory."""
    return [python, "-m", "hosttune_engine", "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port),
            "--enable-prefix-caching", "--gpu-memory-utilization", f"{memory_share:.3f}", *extra]


def router_argv(python: str, port: int, metrics_port: int, policy: str, workers: list[str]) -> list[str]:
    """The router as deploy.router runs it (presets/router.yaml's flags), with this run's policy."""
    router = load_router()
    flags = {"host": "127.0.0.1", "port": port, "policy": policy, "prometheus-host": "127.0.0.1",
             "prometheus-port": metrics_port, **router.flags}
    return [python, str(SCRIPTS / router.script), "--worker-urls", *workers, *flag_argv(flags, {}, None)]


def counters(url: str) -> tuple[float, float]:
    """(prefix-cache hits, queries) in the prompt tokens of one server's /metrics."""
    from hosttune.bench.server_metrics import parse_metrics, sample_of

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as resp:
        sample = sample_of(0.0, parse_metrics(resp.read().decode()))
    return sample.prefix_hits or 0.0, sample.prefix_queries or 0.0


def wait_ready(url: str, timeout: float, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url}{path} not ready within {timeout:.0f}s")


def stop(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        p.terminate()
    for p in processes:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def bare_front(args, policy: str, workload: Workload, logs: Path) -> FrontResult:
    """Fresh replicas (cold caches) and the router with `policy` in front; the bench through it."""
    ports = [args.port + 1 + i for i in range(args.replicas)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    share = args.memory / args.replicas
    extra = ["--load-format", args.load_format, "--device", args.device, *args.engine_arg]
    started = [subprocess.Popen(replica_argv(sys.executable, args.model, p, share, extra),
                                stdout=open(logs / f"{policy}-replica-{i}.log", "w"), stderr=subprocess.STDOUT)
               for i, p in enumerate(ports)]
    try:
        for url in urls:
            wait_ready(url, args.ready_timeout)
        router = f"http://127.0.0.1:{args.port}"
        started.append(subprocess.Popen(router_argv(args.router_python, args.port, args.port + args.replicas + 1,
                                                    policy, urls),
                                        stdout=open(logs / f"{policy}-router.log", "w"), stderr=subprocess.STDOUT))
        wait_ready(router, 120, "/list_workers")
        before = [counters(u) for u in urls]
        # the model's own tokenizer here: the router would route /tokenize too, and file its text in its table
        run = run_async(measure(workload.spec(tokenizer=Path(args.model)), router))
        after = [counters(u) for u in urls]
    finally:
        stop(started)
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    return result_of(policy, run, hits / queries if queries else None)


def deployed_front(args, router: bool, workload: Workload) -> FrontResult:
    """`hosttune deploy --router` or `--no-router` (a rolling restart: cold caches), then the bench."""
    deploy = [sys.executable, "-m", "hosttune", "deploy", "--yes", "-i", args.inventory,
              "--router" if router else "--no-router", *args.deploy_arg]
    subprocess.run(deploy, check=True)
    headers = (("Authorization", f"Bearer {Path(args.api_key_file).read_text().strip()}"),) if args.api_key_file else ()
    run = run_async(measure(workload.spec(headers), args.url))
    return result_of("router prefix_affinity" if router else "nginx least_conn", run, prefix_hit_rate(run.server_metrics))


def table(results: list[FrontResult]) -> str:
    rows = [("front", "req/s", "output tok/s", "TTFT p50 ms", "TTFT p95 ms", "prefix hit rate", "ok / failed")]
    rows += [(r.front, f"{r.request_throughput:.2f}", f"{r.output_token_throughput:.1f}", str(r.ttft_p50_ms),
              str(r.ttft_p95_ms), "-" if r.prefix_hit_rate is None else f"{r.prefix_hit_rate:.2f}",
              f"{r.requests_ok} / {r.requests_failed}") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    bare = sub.add_parser("bare", help="replicas and the router on this machine")
    bare.add_argument("--model", required=True)
    bare.add_argument("--replicas", type=int, default=4)
    bare.add_argument("--memory", type=float, default=0.88, help="the GPU memory the replicas share, split evenly")
    bare.add_argument("--load-format", default="auto")
    bare.add_argument("--device", default="cuda")
    bare.add_argument("--engine-arg", action="append", default=[], help="one more engine argument (repeatable)")
    bare.add_argument("--router-python", default=sys.executable, help="a Python with aiohttp installed")
    bare.add_argument("--port", type=int, default=8000, help="the router's; the replicas take the ports after it")
    bare.add_argument("--ready-timeout", type=float, default=900.0)
    deploy = sub.add_parser("deploy", help="a host deployed by hosttune deploy, its front switched between runs")
    deploy.add_argument("-i", "--inventory", required=True)
    deploy.add_argument("--url", required=True, help="the host's service port")
    deploy.add_argument("--api-key-file")
    deploy.add_argument("--deploy-arg", action="append", default=[], help="one more hosttune deploy argument")
    for p in (bare, deploy):
        for name, value in asdict(Workload()).items():
            p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
        p.add_argument("--out", type=Path, help="the results as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[FrontResult]:
    args = parse_args(argv)
    workload = Workload(**{k: getattr(args, k) for k in asdict(Workload())})
    if args.mode == "bare":
        logs = (args.out.parent if args.out else Path(".")) / "prefix_routing_logs"
        logs.mkdir(parents=True, exist_ok=True)
        results = [bare_front(args, policy, workload, logs) for policy in POLICIES]
    else:
        results = [deployed_front(args, router, workload) for router in (True, False)]
    print(table(results))
    if args.out:
        doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": args.mode,
               "workload": asdict(workload), "results": [asdict(r) for r in results],
               "router": load_router().policy, "host": os.uname().nodename}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
