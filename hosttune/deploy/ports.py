"""The ports one host's deployment listens on (the engine or its replicas, the host's nginx, the prefix router),
each taken by one of them: nginx on a port the engine holds would fail only once the new release is live.
A roll takes them in turn, so a port a live replica holds is free only once the roll has restarted that replica."""

from __future__ import annotations

from hosttune.deploy.errors import DeployError
from hosttune.deploy.placement import Layout
from hosttune.deploy.router import RouterPorts
from hosttune.deploy.units import REPLICA_TEMPLATE

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


def roll_order(layout: Layout, service_port: int, front_port: int | None,
               router: RouterPorts | None) -> list[tuple[int, str, frozenset[int]]]:
    """(port, who, the replicas restarted by then) in the order a roll takes them: nginx's and the router's at the
    switch, before any replica restarts; each replica's when the roll restarts it, after the replicas before it."""
    assert layout.is_balanced, "one service is started once the others have stopped"
    at_switch = listeners(layout, service_port, front_port, router)[len(layout.replicas):]  # nginx's, the router's
    order = [(port, who, frozenset[int]()) for port, who in at_switch]
    for n, replica in enumerate(layout.replicas):
        order.append((replica.port, f"replica {replica.index}", frozenset(r.index for r in layout.replicas[:n + 1])))
    return order


def replica_index(unit: str) -> int | None:
    """hosttune-engine@3.service → 3; None for any other unit."""
    head, _, tail = REPLICA_TEMPLATE.partition("@")
    number = unit.removeprefix(f"{head}@").removesuffix(tail)
    return int(number) if unit.startswith(f"{head}@") and unit.endswith(tail) and number.isdigit() else None


def held_back(order: list[tuple[int, str, frozenset[int]]], held: dict[int, tuple[str, ...] | None],
              live: list[int]) -> str | None:
    """One line on the first port a roll would take while a live replica still holds it (`held`: who listens on
    each port now; `live`: the live replicas), else None. Live replica i listens on the port i + 1 after the
    live service port, as the layout places them."""
    for port, who, restarted in order:
        for unit in held.get(port) or ():
            index = replica_index(unit)
            if index is None or index in restarted:
                continue
            base = port - 1 - index  # the live service port
            first, last = (base + 1 + i for i in (min(live, default=index), max(live, default=index)))
            return (f"port {port}, where {who} would listen, is held by live replica {index} ({unit}) until "
                    f"the roll restarts it, after the port is needed; keep --port {base}, or give one whose ports "
                    f"miss the live replicas' {first}-{last}")
    return None
