"""The ports one host's deployment listens on (the engine or its replicas, the host's nginx, the prefix router),
each taken by one of them: nginx on a port the engine holds would fail only once the new release is live."""

from __future__ import annotations

from hosttune.deploy.errors import DeployError
from hosttune.deploy.placement import Layout
from hosttune.deploy.router import RouterPorts

FRONT = "the host's nginx (deploy.nginx.port)"


def listeners(layout: Layout, service_port: int, front_port: int | None,
              router: RouterPorts | None) -> list[tuple[int, str]]:
    """(port, who) for everything the release starts on the host, in start order."""
    if layout.is_balanced:
        found = [(r.port, f"replica {r.index}") for r in layout.replicas]
        found.append((front_port, FRONT) if front_port else (service_port, "the host's nginx"))
    else:
        found = [(service_port, "the engine")] + ([(front_port, FRONT)] if front_port else [])
    if router is not None:
        found += [(router.listen, "the prefix router"), (router.metrics, "the prefix router's /metrics")]
    return found


def check_ports(host: str, found: list[tuple[int, str]]) -> None:
    """One line naming the first port two listeners would share, or one past 65535."""
    seen: dict[int, str] = {}
    for port, who in found:
        if port > 65535:
            raise DeployError(f"{host}: {who} would listen on port {port}, past 65535; use a lower --port")
        if port in seen:
            raise DeployError(f"{host}: port {port} would be taken twice: by {seen[port]} and by {who}; "
                              f"give deploy.nginx.port or --port another port")
        seen[port] = who
