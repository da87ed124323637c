"""benchmarks/prefix_routing.py as data: the workload it offers by default (the issue's: 64 prompts of
4,000 tokens x 2 users), the replicas' and the router's command lines, the result table."""

from __future__ import annotations

from pathlib import Path

from benchmarks.prefix_routing import FrontResult, Workload, parse_args, replica_argv, router_argv, table


def test_the_default_workload_is_128_users_on_64_long_prompts():
    args = parse_args(["bare", "--model", "/m"])
    spec = Workload(**{k: getattr(args, k) for k in ("prefixes", "users_per_prefix", "prefix_tokens",
                                                      "question_tokens", "max_tokens", "warmup_s", "duration_s")}).spec()
    assert (args.replicas, spec.load.users, spec.shared_prefix, spec.prefix_tokens) == (4, 128, (64, 2), 4000)
    assert (spec.prompt_lengths, spec.output_lengths, spec.load.warmup, spec.load.duration) == ("128", "64", 10.0, 15.0)


def test_replicas_split_the_gpu_and_the_router_runs_as_deploy_runs_it():
    assert replica_argv("py", "/m", 8001, 0.22, ["--load-format", "dummy"]) == [
        "py", "-m", "hosttune_engine", "serve", "--model", "/m", "--host", "127.0.0.1", "--port", "8001",
        "--enable-prefix-caching", "--gpu-memory-utilization", "0.220", "--load-format", "dummy"]
    argv = router_argv("py", 8000, 8005, "least_in_flight", ["http://127.0.0.1:8001", "http://127.0.0.1:8002"])
    assert argv[0] == "py" and argv[1].endswith("/hosttune/deploy/prefix_router.py") and Path(argv[1]).is_file()
    assert argv[2:5] == ["--worker-urls", "http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert "--policy least_in_flight" in " ".join(argv) and "--health-check-interval-secs 2" in " ".join(argv)


def test_the_table_shows_both_fronts():
    text = table([FrontResult("prefix_affinity", 90, 0, 4.8, 19.2, 120.0, 900.0, 0.89),
                  FrontResult("least_in_flight", 40, 1, 2.1, 8.4, 900.0, 3000.0, None)])
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["front", "req/s"] and "0.89" in lines[1] and "40 / 1" in lines[2] and " - " in lines[2]
