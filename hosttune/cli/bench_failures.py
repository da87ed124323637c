"""What `hosttune bench` says on stderr of the requests that failed: a run or a sweep's step that measured nothing
(every request failed, or none was sent), or a run in which some failed; each quotes the first failure and what to
check."""

from __future__ import annotations

from hosttune.bench import report
from hosttune.bench.client import REDIRECT_ADVICE, key_advice
from hosttune.bench.record import FAILED
from hosttune.bench.units import rate_text


def unanswered(outcome: report.Outcome, headers=()) -> list[str]:
    """One line per run that measured nothing: every measured request failed, or none was sent."""
    return [f"all {s.num_requests} measured requests to {run.url} failed "
            f"({', '.join(f'{k}: {v}' for k, v in s.errors_by_status.items())}), so nothing was measured; "
            f"the first {first_failure(run)}; {what_to_check(first_failed(run), headers)}"
            if s.num_requests else none_sent(run)
            for run, s in outcome.runs if s.num_failed == s.num_requests]


def sweep_unanswered(outcome: report.Outcome, headers=()) -> list[str]:
    """One line per sweep that a step whose every measured request failed ended (a server gone or refusing): it
    judges no rate, which reads as a server too slow, or goes unnoticed beside the steps before it, unless the first
    failure says why."""
    lines = []
    for result in outcome.sweeps:
        if not result.points or not (step := result.points[-1]).is_failed:
            continue
        s, before = step.summary, len(result.points) - 1
        where = (f" at {rate_text(step.rate)} requests/s" if before else "")
        ended = (f"so the sweep ended there, its answer from the {before} step{'s' if before > 1 else ''} before it"
                 if before else "so no rate was measured")
        lines.append(f"all {s.num_requests} measured requests of the sweep of {result.url}{where} failed "
                     f"({', '.join(f'{k}: {v}' for k, v in sorted(s.errors_by_status.items()))}), {ended}; "
                     f"the first {first_failure(step.run)}; {what_to_check(first_failed(step.run), headers)}")
    return lines


def none_sent(run) -> str:
    if run.stopped_by and run.window[1] <= run.warmup_end:
        return (f"{run.stopped_by} ended the run to {run.url} during its {run.warmup_end:g} s warm-up, so nothing "
                "was measured")
    if run.stopped_by:  # a far arrival of a low rate or a trace: no warm-up to name
        return (f"{run.stopped_by} ended the run to {run.url} {run.window[1]:.1f} s in, before it sent a measured "
                "request, so nothing was measured")
    advice = ("its trace's arrivals all came within it: give a shorter --warmup" if run.mode == "trace" else
              "give a longer --duration (or more --users, or a higher --rate)")
    return f"no request to {run.url} was sent after its {run.warmup_end:g} s warm-up, so nothing was measured; {advice}"


def partly_failed(outcome: report.Outcome) -> list[str]:
    """One line per run in which some measured requests failed, quoting the first: the table counts them by
    status, and the server's reason is otherwise only in requests.csv."""
    return [f"{s.num_failed} of {s.num_requests} measured requests to {run.url} failed "
            f"({', '.join(f'{k}: {v}' for k, v in s.errors_by_status.items() if k != '429')}); "
            f"the first {first_failure(run)}"
            for run, s in outcome.runs if 0 < s.num_failed < s.num_requests]


def first_failed(run):
    return min((r for r in run.requests if not r.is_warmup and r.outcome == FAILED), key=lambda r: r.sent)


def first_failure(run) -> str:
    first = first_failed(run)
    is_answered = first.status and not first.error.startswith("timeout:")  # a stream cut at --timeout failed
    return f"{'answered' if is_answered else 'failed:'} {first.reason}"


def what_to_check(first, headers) -> str:
    """What to fix, by what the first failed request got: no answer (a server down or stuck), a missing key
    (where /v1/models, which finds that first, needs none), a redirect, a prompt or output past the model's context or
    a field the server does not take (ignore_eos, a vLLM extension, is sent by default), or a wrong model, route or
    server."""
    status = first.status
    if status == 0 and "SSL handshake" in first.error:  # an https:// URL to a port that speaks plain http
        return "check that the server speaks https at --url (a plain http port never answers a TLS handshake)"
    if status == 0 and first.error.startswith("transport:"):  # no answer at all: not a model or route to fix
        return "check that the server is up and listens at --url"
    if status == 200 and first.error.startswith("timeout:"):  # it answered, and streamed too slowly
        return ("the server streams too slowly to finish within --timeout: give a longer one, or ask for fewer "
                "--max-tokens")
    if status == 0 and first.error.startswith("timeout:"):
        return "the server answered nothing within --timeout: check that it is up and not stuck, or give a longer one"
    if status in (401, 403):
        return key_advice(headers)
    if 300 <= status < 400:
        return REDIRECT_ADVICE
    if status == 400:
        return ("check that --prompts and --max-tokens fit the model's context, or leave out a field the server does "
                "not take: --no-ignore-eos, no --priority")
    return "check --model and --api, and that it is an OpenAI-compatible server"
