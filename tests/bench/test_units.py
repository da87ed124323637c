import pytest

from hosttune.bench.units import parse_duration, parse_slo
from hosttune.errors import BenchError


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600),
                                           ("500ms", 0.5), ("1.5s", 1.5), (" 2 m ", 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5d", "-1s", "1.2.3s"])
def test_bad_durations(text):
    with pytest.raises(BenchError, match="ms, s, m or h"):
        parse_duration(text)


def test_slo():
    slo = parse_slo("ttft=500ms, e2e=2s,tpot=40ms", percentile=99, max_error_rate=0.02)
    assert (slo.ttft, slo.e2e, slo.tpot, slo.percentile, slo.max_error_rate) == (0.5, 2.0, 0.04, 99, 0.02)
    assert parse_slo("e2e=2").limits() == {"e2e": 2.0}


@pytest.mark.parametrize("text, message", [("p95=2s", "use ttft"), ("e2e", "use ttft"), (",", "names no limit"),
                                           ("ttft=1s,TTFT=2s", "gives ttft twice"),
                                           ("e2e=2s,", r"^SLO 'e2e=2s,' has an empty entry; give limits such as "
                                                       r"ttft=500ms,e2e=2s \(no empty term between commas\)$"),
                                           ("ttft=1s,,e2e=2s", "has an empty entry")])
def test_bad_slo(text, message):
    with pytest.raises(BenchError, match=message):
        parse_slo(text)
