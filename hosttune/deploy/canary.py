"""--canary N with an SLO: after the first N hosts are deployed, a short open-loop `hosttune bench`
against each of them; one that misses the SLO stops the rollout before the other hosts change."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace

from hosttune.bench.extra import require_bench_extra
from hosttune.deploy.access import Tls, access_for
from hosttune.deploy.errors import DeployError
from hosttune.deploy.host import HostDeploy
from hosttune.deploy.settings import resolve
from hosttune.errors import HosttuneError
from hosttune.presets import load_preset


@dataclass(frozen=True)
class CanaryBench:
    slo: str  # as `hosttune bench --slo`, e.g. e2e=2s,ttft=500ms
    rate: float = 1.0  # requests per second, Poisson
    duration: str = "30s"
    prompts: str = "uniform:32-512"
    max_tokens: str = "64"
    percentile: float = 95.0
    max_error_rate: float = 0.0


@dataclass(frozen=True)
class CanaryTarget:
    """Where the canary bench sends its requests, and what it sends them with."""

    url: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # the group's key, as its callers send it
    tls: ssl.SSLContext | None = field(default=None, repr=False)


def target(outcome: HostDeploy, request) -> CanaryTarget:
    """The host's service as this deploy shaped it (the options over the inventory over what was live), reached
    as its callers reach it: through its nginx front (https, trusting the deployment's CA) when it has one, else
    on the service port, with the group's API key when it has one."""
    access = access_for(outcome.host, request.keys_dir)
    headers = (("Authorization", f"Bearer {access.key}"),) if access.key else ()
    address = outcome.host.connection.address
    if access.front:
        tls = access.front.tls
        scheme = "https" if tls else "http"
        return CanaryTarget(f"{scheme}://{address}:{access.front.port}", headers, _trust(tls, address) if tls else None)
    shape = outcome.shape or request.shape
    settings = resolve(outcome.host, load_preset(shape.engine), shape.model, shape.port, request.overrides)
    return CanaryTarget(f"http://{address}:{settings.port}", headers)


def _trust(tls: Tls, address: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=str(tls.ca) if tls.ca else None)
    except (OSError, ssl.SSLError) as exc:
        raise DeployError(f"deploy.nginx.tls_ca {tls.ca}: not a readable PEM file of CA certificates ({exc})") from None
    if tls.name and tls.name != address:  # the certificate carries tls_name, not the address dialled: its chain
        context.check_hostname = False   # is still checked against the deployment's CA, as the balancer does
    return context


def canary_check(bench: CanaryBench | None, request):
    """The check deploy_fleet runs after the canaries, made before any plan: an SLO with no canaries to hold
    to it, one bench cannot read, or no bench to measure it is an error now, not once the canaries changed."""
    if bench is None:
        return None
    if not request.canary:
        raise DeployError(f"--canary-slo {bench.slo} measures the canaries: give --canary N too")
    require_bench_extra()
    return slo_check(bench, request)


def slo_check(bench: CanaryBench, request):
    """A canary_check for deploy_fleet: the reason the canaries fail the SLO, or None."""
    # bench pulls in aiohttp: imported only when a canary is benchmarked
    from hosttune.bench.benchmark import BenchSpec, measure_sync
    from hosttune.bench.loadgen import Load
    from hosttune.bench.metrics import summarize
    from hosttune.bench.units import parse_positive_duration, parse_slo

    slo = parse_slo(bench.slo, bench.percentile, bench.max_error_rate)
    load = Load(users=None, rate=bench.rate, duration=parse_positive_duration(bench.duration, "--canary-duration"),
                warmup=0.0)
    spec = BenchSpec(load=load, prompt_lengths=bench.prompts, output_lengths=bench.max_tokens, slo=slo)

    def check(outcomes: list[HostDeploy]) -> str | None:
        for outcome in outcomes:
            try:
                host = target(outcome, request)
                summary = summarize(measure_sync(replace(spec, headers=host.headers, tls=host.tls), host.url), slo)
            except HosttuneError as exc:  # the rest is skipped with why; the canaries' recap still prints
                return f"the canary {outcome.host.name} cannot be benchmarked: {exc}"
            if not summary.slo_met:
                return (f"the canary {outcome.host.name} missed the SLO {bench.slo} at {bench.rate:g} req/s "
                        f"({summary.num_ok} of {summary.num_requests} requests ok)")
        return None

    return check
