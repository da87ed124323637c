"""Serving facts: the deployed engine's units, its ports' answers and the host nginx front, as the serve probe reads
them; and the state of hosttune's own monitor on the host."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class UnitHealth:
    """A systemd unit of the deployment, with the journal's last lines when it is not running."""

    name: str
    load: str  # "loaded" | "not-found" | ...
    active: str  # "active" | "inactive" | "failed" | "activating" | ...
    sub: str  # "running" | "dead" | "auto-restart" | ...
    result: str = ""  # "success" | "exit-code" | "signal" | ...
    type: str = ""  # "simple" | "oneshot" | ...
    restarts: int | None = None
    journal: tuple[str, ...] = ()

    @property
    def is_running(self) -> bool:
        """A oneshot (the replica probe) is inactive between runs and counts as running unless its last run failed."""
        if self.type == "oneshot":
            return self.load == "loaded" and self.active != "failed"
        return self.active == "active"

    @property
    def state(self) -> str:
        detail = f"{self.active}/{self.sub}" + (f" ({self.result})" if self.result not in ("", "success") else "")
        return detail if self.load == "loaded" else f"{self.load}"


@dataclass(frozen=True)
class EndpointHealth:
    """An engine port (the service, or one replica): /health and one one-token generation."""

    role: str  # "engine" | "replica 0" | ...
    port: int
    health: str  # HTTP status of /health ("200", "503") or "error: ..."
    generation: str  # "ok", "not tried" or why it failed
    seconds: float | None  # of the generation
    timeout_s: float

    @property
    def is_serving(self) -> bool:
        return self.health == "200" and self.generation == "ok" and (self.seconds or 0.0) <= self.timeout_s


@dataclass(frozen=True)
class FrontHealth:
    """A port of the host nginx front: /health through it."""

    conf: str
    port: int
    scheme: str
    health: str


@dataclass(frozen=True)
class UpstreamServer:
    """A server of a front's upstream: marked down (drained, failing its probe) or not accepting connections."""

    conf: str
    server: str
    down: bool
    reachable: bool


@dataclass(frozen=True)
class ServeFacts:
    release: str = ""  # the live release's id ("" when hosttune deployed nothing here)
    engine: str = ""
    units: tuple[UnitHealth, ...] = ()
    endpoints: tuple[EndpointHealth, ...] = ()
    fronts: tuple[FrontHealth, ...] = ()
    upstreams: tuple[UpstreamServer, ...] = ()


@dataclass(frozen=True)
class TimerState:
    name: str
    load: str = ""
    active: str = ""
    enabled: str = ""
    interval: str = ""  # OnUnitActiveSec= of its unit file


@dataclass(frozen=True)
class MonitorFacts:
    """hosttune installed on the host by apply's monitor: its version and its timers."""

    installed: str | None = None  # the version in /opt/hosttune-monitor/venv
    timers: tuple[TimerState, ...] = ()
    written: dict[str, int] = field(default_factory=dict)  # status and timer file name → when last written (epoch s)
    now: int | None = None  # the host's clock when it was read

    def timer(self, name: str) -> TimerState:
        return next((t for t in self.timers if t.name == name), TimerState(name))
