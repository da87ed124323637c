"""The start-up benchmark (benchmarks/engine/startup.py) reading a server log recorded on the H200: the phases
from the log's timestamps, the warmup groups, the builds at start and while serving, and its table."""

from datetime import datetime

import pytest

from benchmarks.engine import startup as bench

# Recorded: the second of three starts of the step-budget server on one H200 (1ed5199), then one warning
# line as the server at dbbd00b wrote it (the split-K prefix attention built under traffic).
LOG = """\
2026-12-01 20:51:32,965 INFO hosttune_engine.server: listening on http://127.0.0.1:43573 (loading /tmp/m)
2026-12-01 20:51:36,500 INFO hosttune_engine.server: engine code imported in 3.5 s
2026-12-01 20:51:37,305 INFO hosttune_engine.core.model_runner: model loaded in 0.4 s
2026-12-01 20:51:38,164 INFO hosttune_engine.core.model_runner: KV pool sized in 0.9 s
2026-12-01 20:51:39,279 INFO hosttune_engine.core.model_runner: decode graphs captured in 1.1 s
2026-12-01 20:51:39,893 INFO hosttune_engine.core.model_runner: prefill graphs captured in 0.6 s
2026-12-01 20:51:40,844 INFO hosttune_engine.core.model_runner: mixed-step graphs captured in 1.0 s
2026-12-01 20:51:43,566 INFO hosttune_engine.server: warmup done in 2.5 s (prefill-37 0.01, prefill-512 0.02, \
prefill-1500 0.06, prefill-2048 0.05, prefill-4001 0.10, prefill-4096 0.10, prefill-8181 0.21, chunked 0.92, \
mixed 0.45, decode-ramp 0.74)
2026-12-01 20:51:44,663 INFO hosttune_engine.server: step costs measured in 1.1 s
2026-12-01 20:51:44,663 INFO hosttune_engine.server: 31 kernel variants built during start, 0.5 s of it
2026-12-01 20:51:44,663 INFO hosttune_engine.server: ready: serving qwen7b-dummy
2026-12-01 20:44:40,751 WARNING hosttune_engine.core.kernel_compiles: kernel _prefill_attention_kernel was built \
while serving (5 ms, the steps running then waited): warmup did not cover this shape
"""


@pytest.fixture
def startup():
    return bench


def test_phases_groups_and_builds_from_a_recorded_log(startup):
    started = datetime(2026, 12, 1, 20, 51, 32, 365000).timestamp()  # the process 0.6 s before it listened
    phases = startup.phase_times(LOG, started)
    assert list(phases) == [name for name, _ in startup.PHASES]
    assert phases["listening"] == pytest.approx(0.6) and phases["ready"] == pytest.approx(12.3)
    assert all(a <= b for a, b in zip(list(phases.values()), list(phases.values())[1:]))
    groups = startup.warmup_groups(LOG)
    assert len(groups) == 10 and groups["chunked"] == 0.92 and groups["decode-ramp"] == 0.74
    assert startup.start_builds(LOG) == {"variants": 31, "seconds": 0.5}
    assert startup.serving_builds(LOG) == [("_prefill_attention_kernel", 5)]


def test_table_shows_each_start_and_the_ttft_ratio(startup):
    run = {"seconds_to_healthy": 12.3, "kernel_builds_at_start": {"variants": 31, "seconds": 0.5},
           "kernel_compiles_while_serving": 0, "first_ttft_ms": {"after_healthy": [8.6, 149.5], "warm": [7.9, 141.1]},
           "burst": {"ttft_p95_ms": 5967.5}, "phases_s": {"listening": 0.6, "ready": 12.3}}
    lines = startup.table([run, {}]).splitlines()
    assert lines[2].split()[:5] == ["0", "12.3", "31", "in", "0.5"]
    assert "1.09x" in lines[2] and "listening 0.6 ready 12.3" in lines[2]
    assert lines[3].split()[:2] == ["1", "-"]  # a start that failed before it was healthy
    assert lines[-1].startswith("targets:")
