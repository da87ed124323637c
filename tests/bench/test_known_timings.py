"""Against a server whose delays are scripted, bench reports the
percentiles those delays imply, within 1 ms plus the client's own loop lag in that run."""

import json

import numpy as np
import pytest

from hosttune.bench.benchmark import BenchSpec, run_async, measure
from hosttune.bench.loadgen import Load
from hosttune.bench.metrics import PERCENTILES, summarize
from hosttune.bench.record import OK

from .servers import realtime

TTFT, PER_PROMPT_TOKEN, ITL = 0.030, 0.0001, (0.004, 0.008, 0.012)
LENGTHS = [(10 + (i * 37) % 190, 3 + (i * 5) % 9) for i in range(40)]  # (prompt, output)
TOLERANCE = 0.001  # seconds


def expected(lengths):
    """Each request's TTFT, gaps, TPOT and E2E as the script makes them."""
    ttft, itl, tpot, e2e = [], [], [], []
    for prompt_tokens, output_tokens in lengths:
        first = TTFT + PER_PROMPT_TOKEN * prompt_tokens
        gaps = [ITL[i % len(ITL)] for i in range(output_tokens - 1)]
        ttft.append(first)
        itl.extend(gaps)
        tpot.append(sum(gaps) / len(gaps))
        e2e.append(first + sum(gaps))
    return {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e": e2e}


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) + "\n"
                            for p, o in LENGTHS))
    return path


def deviations(summary, want):
    """(metric, percentile, measured, known) for every reported percentile."""
    rows = []
    for metric, values in want.items():
        stats = getattr(summary, metric)
        assert stats.count == len(values)
        for q in PERCENTILES:
            rows.append((metric, q, stats.at(q), float(np.percentile(values, q))))
    return rows


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_reports_scripted_percentiles_within_1ms(server_factory, lengths_file, api):
    """Every percentile of TTFT, ITL, TPOT and E2E is within 1 ms of the scripted value, plus the
    client's event-loop lag (P99) that the run itself measured: a chunk read late by a busy loop
    is timed late by that much, which bench reports as lag rather than hides.

    This machine's two cores are shared with other work, so the server and the client
    run at real-time priority where permitted; and a run during which another process
    still took the CPU from them is repeated, up to three runs in all. Each run's data
    must be complete and exact regardless."""
    url = server_factory("--realtime", "--ttft", str(TTFT), "--ttft-per-prompt-token", str(PER_PROMPT_TOKEN),
                         "--itl", ",".join(map(str, ITL)))
    spec = BenchSpec(
        load=Load(users=4, num_requests=2 * len(LENGTHS)), api=api,
        prompt_lengths=f"jsonl:{lengths_file}", output_lengths=f"jsonl:{lengths_file}",
    )
    want = expected(LENGTHS * 2)
    attempts = []
    for _ in range(3):
        with realtime():
            run = run_async(measure(spec, url))
        summary = summarize(run)
        check_exact_lengths(run, url, summary)
        rows = deviations(summary, want)
        worst = max(rows, key=lambda row: abs(row[2] - row[3]))
        margin = TOLERANCE + summary.lag.loop_p99
        attempts.append(f"{worst[0]} P{worst[1]}: {worst[2] * 1e3:.3f} ms, known "
                        f"{worst[3] * 1e3:.3f} ms (client loop lag P99 {summary.lag.loop_p99 * 1e3:.2f} ms)")
        if abs(worst[2] - worst[3]) <= margin:
            break
    print(f"{api}: worst deviation per run:", attempts)
    assert abs(worst[2] - worst[3]) <= margin, attempts


def check_exact_lengths(run, url, summary):
    """The prompts were exact (via /tokenize) and the server produced what was asked."""
    assert run.tokenizer.startswith(f"{url}/tokenize")
    assert summary.num_ok == 2 * len(LENGTHS) and summary.num_failed == 0
    for r in run.requests:
        assert r.outcome == OK
        assert r.reported_prompt_tokens == r.prompt_tokens == LENGTHS[r.index % 40][0]
        assert r.output_tokens == len(r.chunks) == LENGTHS[r.index % 40][1]
