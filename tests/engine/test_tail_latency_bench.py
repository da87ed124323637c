"""The tail-latency script's summary of a server's step log (benchmarks/engine/tail_latency.py)."""

import json

import pytest

from benchmarks.engine import tail_latency as bench


@pytest.fixture
def tail_latency():
    return bench


def line(t, ms, decodes, prefill, estimate=None, scale=1.0):
    return json.dumps({"t": t, "ms": ms, "decodes": decodes, "prefill_tokens": prefill,
                       "prefill_seqs": int(prefill > 0), "estimate_ms": estimate, "scale": scale, "priority": 0})


def test_the_step_log_summary_keeps_the_window_and_splits_mixed_from_decode_only(tail_latency, tmp_path):
    path = tmp_path / "steps.jsonl"
    rows = [line(1.0, 500.0, 0, 8000),  # before the window: warmup
            line(2.0, None, 4, 0),  # after an idle engine: no real time
            *(line(3.0 + i, 20.0 + i, 60, 400, estimate=10.0 + i / 2, scale=1.5) for i in range(5)),
            *(line(9.0 + i, 10.0, 64, 0) for i in range(5)),
            line(99.0, 900.0, 64, 8000)]  # after the window
    path.write_text("\n".join(rows) + "\n")
    got = tail_latency.step_summary(path, 2.0, 20.0)
    assert got["steps"] == 10 and got["mixed_share"] == 0.5
    assert (got["mixed_ms_p50"], got["decode_ms_p50"], got["decode_ms_p99"]) == (22.0, 10.0, 10.0)
    assert got["prefill_tokens_per_mixed_step"] == 400.0 and got["real_over_estimate_p50"] == 2.0
    assert got["scale_last"] == 1.0 and got["all_ms_p99"] == pytest.approx(23.91)
    assert tail_latency.step_summary(tmp_path / "none.jsonl", 0, 1) is None
