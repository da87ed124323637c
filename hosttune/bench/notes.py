"""Notes a run's figures need beside them, for the terminal and the report: where a figure the table shows is no
measurement, or not the one its name says."""

from __future__ import annotations

from hosttune.bench.metrics import Summary, measured
from hosttune.bench.record import OK, RunRecord


def unmeasured_note(run: RunRecord, s: Summary) -> str:
    """Why a run shows no requests/s: no request ended in its window ('' where some did, or none succeeded)."""
    ended = [r.e2e for r in measured(run.requests) if r.outcome == OK]  # failures say why on their own
    if s.is_rate_measured or not ended:
        return ""
    return (f"no request ended within the {s.window_s:g} s measured window (the quickest took {min(ended):.2f} s), "
            "so requests/s and tokens/s served are not measured; give a --duration longer than a request, or a "
            "--warmup")


def usage_note(run: RunRecord) -> str:
    """Why output tokens may be undercounted: successful requests whose stream reported no usage ('' where all did)."""
    ok = [r for r in measured(run.requests) if r.outcome == OK]
    missing = sum(r.reported_prompt_tokens is None for r in ok)
    if not missing:
        return ""
    return (f"{missing} of {len(ok)} requests streamed no usage (stream_options.include_usage), so their output "
            "tokens are counted as the events that carried text; a server that sends several tokens an event makes "
            "TPOT and output tokens/s per event, not per token")
