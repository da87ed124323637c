"""What deploys and rolls back as one: a host alone, or a whole multi-node (Ray) group, which --limit takes all
of or none of."""

from __future__ import annotations

from hosttune.config.inventory import Host, Inventory
from hosttune.deploy.errors import DeployError
from hosttune.deploy.group_rollback import refuse_split
from hosttune.deploy.shape import declared


def is_multinode(host: Host, engine: str | None) -> bool:
    """The host's group runs one vLLM over Ray (deploy.multinode); with another engine each host serves alone."""
    multinode = host.deploy.get("multinode", False)
    if not isinstance(multinode, bool):  # "false" in quotes would read as true
        raise DeployError(f"{host.source}: deploy.multinode must be true or false (got {multinode!r})")
    return (engine or declared(host).engine) == "vllm" and multinode


def rollout_units(inventory: Inventory, engine: str | None) -> list[list[Host]]:
    """What rolls as one: a host, or a whole multi-node group (vLLM with deploy.multinode)."""
    units: list[list[Host]] = []
    seen: set[str] = set()
    for host in inventory.hosts:
        if host.group in seen:
            continue
        if is_multinode(host, engine):
            seen.add(host.group)
            units.append([h for h in inventory.hosts if h.group == host.group])
        else:
            units.append([host])
    return units


def check_whole_groups(full: Inventory, chosen: Inventory, engine: str | None, limit: str | None) -> None:
    """A multi-node group deploys (and rolls back) as one: --limit takes all of its hosts or none (those it kept
    would become a group of their own, the first one its Ray head, and the others would serve on as they were)."""
    for group, members, kept in _split_groups(full, chosen):
        if is_multinode(members[0], engine):
            raise DeployError(f"--limit {limit} takes {', '.join(kept)} of the multi-node vLLM group {group}, which "
                              f"serves as one ({', '.join(h.name for h in members)}): limit to all of its hosts or "
                              f"to none")


def check_whole_ray_groups(full: Inventory, chosen: Inventory, limit: str | None) -> None:
    """--rollback --limit: a deploy.multinode group whose releases are a Ray group goes back whole, whatever its
    deploy.engine says (read on the hosts kept); one whose releases serve host by host goes back per host."""
    for group, members, kept in _split_groups(full, chosen):
        if is_multinode(members[0], "vllm"):
            refuse_split(group, [h for h in members if h.name in kept], [h.name for h in members if h.name not in kept],
                         limit)


def _split_groups(full: Inventory, chosen: Inventory):
    """(group, its hosts, the names of those --limit kept) for each group --limit took only some of."""
    names = {h.name for h in chosen.hosts}
    for group in dict.fromkeys(h.group for h in chosen.hosts):
        members = [h for h in full.hosts if h.group == group]
        kept = [h.name for h in members if h.name in names]
        if len(kept) < len(members):
            yield group, members, kept
