"""The inventory: hosts, groups and their vars, read from YAML and validated.

Layout (inventories/example.yaml shows every field):

    defaults: {VARS}                 # for every host
    groups:
      NAME: {vars: {VARS}, hosts: {HOST: {VARS}, ...}}
    hosts: {HOST: {VARS}, ...}       # hosts outside any group

Vars merge defaults < group vars < host vars (mappings merge key by key).
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from hosttune import cpulist
from hosttune.errors import InventoryError
from hosttune.transport.base import ConnectionSpec
from hosttune.config.pins import pin_problem
from hosttune.config.unit_text import unit_text_error
from hosttune.config.yamlfile import LocatedDict, load

DEFAULT_PROFILE = "inference-latency"


NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,252}")
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _string(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("must be a string")
    return str(value)


def _pin(kind: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        """A pin: text, or a whole number. A YAML float has lost its trailing zeros already (3.10 reads as 3.1)."""
        if isinstance(value, float):
            raise ValueError("YAML read it as a number, which drops trailing zeros (3.10 becomes 3.1); write the "
                             "version in quotes")
        text = _string(value)
        if problem := pin_problem(kind, text):
            raise ValueError(problem)
        return text

    return check


def _address(value: Any) -> str:
    """A DNS name (ASCII, RFC 1123 lengths) or an IP address; nothing else reaches a resolver."""
    text = _string(value)
    try:
        return str(ipaddress.ip_address(text.strip("[]")))  # [::1] → ::1, as sockets and ssh_config want it
    except ValueError:
        pass
    if not text.isascii():
        raise ValueError("must be an ASCII host name or IP address (write an international name in its xn-- form)")
    name = text.removesuffix(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError("must be a host name (dot-separated labels of at most 63 letters, digits or '-', "
                         "253 characters in all) or an IP address")
    return text


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError("must be a port number between 1 and 65535")
    return value


MAX_SECONDS = 86_400.0  # a day: past any probe or SSH round trip worth waiting for


def _positive(value: Any) -> float:
    # `not 0 < value <= MAX` also refuses YAML's .nan and .inf, which no timer takes
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS:
        raise ValueError(f"must be a positive number of seconds, at most {MAX_SECONDS:g}")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _cpus(value: Any) -> str:
    text = _string(value)
    cpulist.parse(text)
    return text


def _gpus(value: Any) -> str:
    text = _string(value)
    if text != "all":
        try:
            cpulist.parse(text)  # GPU index lists use the same "0-3,5" syntax
        except ValueError:
            raise ValueError("must be all or GPU indices such as 0-3 or 0,2") from None
    return text


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of: {', '.join(choices)}")
        return value

    return check


def _mapping(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError("must be a mapping")
    return value


# The schema of host vars: a validator per field, or a nested schema for a mapping.
VARS_SCHEMA: dict[str, Any] = {
    "address": _address,
    "transport": _one_of("ssh", "local"),
    "ssh": {
        "user": _string,
        "port": _port,
        "key": _string,
        "known_hosts": _string,
        "timeout": _positive,
        "become": _bool,
    },
    "profile": _string,
    "probe_timeout": _positive,
    "pins": {"driver": _pin("driver"), "cuda": _pin("cuda"), "python": _pin("python")},
    "gpus": _gpus,
    "irq_cores": _cpus,
    "rcu_nocbs": _cpus,
    "tune": _mapping,
    "deploy": _mapping,  # engine serving settings, validated by hosttune.deploy.settings
}


@dataclass(frozen=True)
class Pins:
    """Versions the fleet is pinned to; None leaves the profile's value."""

    driver: str | None = None
    cuda: str | None = None
    python: str | None = None


@dataclass(frozen=True)
class Host:
    """One host with its merged vars."""

    name: str
    group: str
    connection: ConnectionSpec
    profile: str = DEFAULT_PROFILE
    pins: Pins = Pins()
    gpus: str = "all"
    irq_cores: str | None = None
    rcu_nocbs: str | None = None
    tune: dict = field(default_factory=dict, hash=False)
    deploy: dict = field(default_factory=dict, hash=False)
    source: str = "<built-in>"
    probe_timeout_s: float = 60.0
    profile_source: str = ""  # FILE:LINE where the profile was named ("" for the default)

    @property
    def path(self) -> str:
        """The inventory file this host came from."""
        return self.source.rsplit(":", 1)[0]


@dataclass(frozen=True)
class Inventory:
    """Hosts in file order, and where they came from."""

    hosts: tuple[Host, ...]
    source: str
    empty_groups: tuple[str, ...] = ()  # groups the file declares with no host under them

    @property
    def groups(self) -> dict[str, list[Host]]:
        grouped: dict[str, list[Host]] = {}
        for host in self.hosts:
            grouped.setdefault(host.group, []).append(host)
        return grouped

    def limit(self, patterns: str | None) -> "Inventory":
        """Keep hosts whose name or group matches any comma-separated glob."""
        if patterns is None:
            return self
        wanted = [p.strip() for p in patterns.split(",")]
        if not any(wanted):  # `-l "$HOST"` with HOST unset must not mean every host
            raise InventoryError(f"--limit {patterns!r} names no host or group; leave --limit out for every host")
        if "" in wanted:  # nor `-l "$A,$B"` with B unset A alone
            raise InventoryError(f"--limit {patterns!r} has an empty entry; list hosts or groups such as gpu-01,h100 "
                                 "(no empty name between commas)")
        kept = tuple(h for h in self.hosts if any(_matches(h, p) for p in wanted))
        where = "the default inventory (this machine, named localhost)" if self.source == "<built-in>" else self.source
        # a mistyped name among several would otherwise leave its host out without a word
        unmatched = [p for p in wanted if not any(_matches(h, p) for h in self.hosts)]
        if empty := [g for p in unmatched for g in self.empty_groups if fnmatch.fnmatchcase(g, p)]:
            raise InventoryError(f"--limit {patterns!r}: group {empty[0]!r} in {where} has no hosts; add hosts under "
                                 f"groups.{empty[0]}.hosts or limit to another group")
        if not kept:
            raise InventoryError(f"--limit {patterns!r} matches no host or group in {where}{self._nearest(wanted)}")
        if unmatched:
            raise InventoryError(f"--limit {patterns!r}: {', '.join(map(repr, unmatched))} matches no host or group "
                                 f"in {where}{self._nearest(unmatched)}; correct it or leave it out")
        return replace(self, hosts=kept)

    def _nearest(self, patterns: list[str]) -> str:
        """" (did you mean gpu-a100-01?)" for a mistyped name, "" when nothing is close (or it is a glob)."""
        names = list(dict.fromkeys([h.name for h in self.hosts] + [h.group for h in self.hosts]))
        close = [m for p in patterns if not set(p) & set("*?[")
                 for m in difflib.get_close_matches(p, names, n=1, cutoff=0.75)]
        return f" (did you mean {', '.join(close)}?)" if close else ""


def _matches(host: Host, pattern: str) -> bool:
    return fnmatch.fnmatchcase(host.name, pattern) or fnmatch.fnmatchcase(host.group, pattern)


def local_inventory() -> Inventory:
    """The built-in inventory: this machine over the local transport."""
    spec = ConnectionSpec(host_name="localhost", transport="local")
    return Inventory((Host(name="localhost", group="local", connection=spec),), "<built-in>")


def load_inventory(path: str | Path, *, accept_new_host_keys: bool = False) -> Inventory:
    """Read and validate an inventory file."""
    path = Path(path)
    doc = load(path, InventoryError)
    reader = _Reader(path)
    if not isinstance(doc, LocatedDict):
        raise InventoryError(f"{path}:1: the inventory must be a mapping with 'groups' and/or 'hosts'")
    reader.unknown_keys(doc, {"defaults", "groups", "hosts"}, "")
    defaults = reader.vars(_or_empty(doc.get("defaults")), "defaults", doc.line_of("defaults"))
    hosts: list[Host] = []
    empty_groups: list[str] = []
    for group, gdoc in reader.entries(doc, "groups"):
        reader.unknown_keys(gdoc, {"vars", "hosts"}, f"groups.{group}")
        gvars = reader.vars(_or_empty(gdoc.get("vars")), f"groups.{group}.vars", gdoc.line_of("vars"))
        entries = reader.host_entries(gdoc, f"groups.{group}")
        empty_groups += [] if entries else [group]
        for name, hdoc, line in entries:
            hvars = reader.vars(hdoc, f"groups.{group}.hosts.{name}", line)
            hosts.append(reader.host(name, group, _merge(defaults, gvars, hvars), line, accept_new_host_keys))
    for name, hdoc, line in reader.host_entries(doc, ""):
        hvars = reader.vars(hdoc, f"hosts.{name}", line)
        hosts.append(reader.host(name, "ungrouped", _merge(defaults, hvars), line, accept_new_host_keys))
    _no_duplicates(hosts)
    if not hosts:
        raise InventoryError(f"{path}: no hosts defined (add 'hosts:' or 'groups: NAME: hosts:')")
    return Inventory(tuple(hosts), str(path), tuple(empty_groups))


def _or_empty(node: Any) -> Any:
    """A key written with no value is empty vars; anything else (an empty list too) is checked as vars."""
    return LocatedDict() if node is None else node


class _Reader:
    """Walks the YAML tree; every complaint names file, line and field path."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, line: int, field_path: str, message: str) -> InventoryError:
        return InventoryError(f"{self.path}:{line}: {field_path}: {message}")

    def name(self, line: int, field_path: str, name: Any) -> None:
        """Host and group names reach reports and ssh configs: printable, no spaces or control characters."""
        if isinstance(name, bool) or not isinstance(name, (str, int)) or not NAME.fullmatch(str(name)):
            raise self.fail(line, field_path, f"{_shown(name)} is not a valid name (letters, digits and . _ - @ :, "
                            "starting with a letter, digit or _, at most 253 characters)")

    def unknown_keys(self, node: LocatedDict, allowed: set[str], prefix: str) -> None:
        for key in node:
            if key not in allowed:
                where = f"{prefix}.{_shown(key, quote=False)}" if prefix else _shown(key, quote=False)
                raise self.fail(node.line_of(key), where, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def entries(self, node: LocatedDict, key: str):
        value = node.get(key)
        if value is None:
            return []
        if not isinstance(value, LocatedDict):
            raise self.fail(node.line_of(key), key, "must be a mapping of names to entries")
        for name, sub in value.items():
            self.name(value.line_of(name), key, name)
            if not isinstance(sub, LocatedDict):
                raise self.fail(value.line_of(name), f"{key}.{name}", "must be a mapping")
        return list(value.items())

    def host_entries(self, node: LocatedDict, prefix: str):
        key_path = f"{prefix}.hosts" if prefix else "hosts"
        value = node.get("hosts")
        if value is None:
            return []
        if not isinstance(value, LocatedDict):
            raise self.fail(node.line_of("hosts"), key_path, "must be a mapping of host names to vars")
        out = []
        for name, hdoc in value.items():
            line = value.line_of(name)
            self.name(line, key_path, name)
            if hdoc is None:
                hdoc = LocatedDict()
                hdoc.line = line
            if not isinstance(hdoc, LocatedDict):
                raise self.fail(line, f"{key_path}.{name}", "must be a mapping of vars (or empty)")
            out.append((str(name), hdoc, line))
        return out

    def vars(self, node: Any, field_path: str, line: int) -> dict:
        if not isinstance(node, LocatedDict):
            raise self.fail(line, field_path, "must be a mapping")
        out = self._validate(node, VARS_SCHEMA, field_path)
        self.deploy_env(out.get("deploy"), f"{field_path}.deploy")
        return out

    def deploy_env(self, deploy: Any, prefix: str) -> None:
        """deploy.env's values go on the service's Environment= lines: `--set env.NAME=...`'s rule, with this line."""
        env = deploy.get("env") if isinstance(deploy, LocatedDict) else None
        if env is None:
            return
        if not isinstance(env, LocatedDict):
            raise self.fail(deploy.line_of("env"), f"{prefix}.env", f"must be a mapping of names to values (got {_shown(env)})")
        for name, value in env.items():
            why = unit_text_error(value)
            if why:
                raise self.fail(env.line_of(name), f"{prefix}.env.{name}", why)

    def _validate(self, node: LocatedDict, schema: dict, prefix: str) -> LocatedDict:
        self.unknown_keys(node, set(schema), prefix)
        out = LocatedDict()
        out.line, out.lines = node.line, dict(node.lines)
        for key, value in node.items():
            rule, where = schema[key], f"{prefix}.{key}"
            if isinstance(rule, dict):
                if not isinstance(value, LocatedDict):
                    raise self.fail(node.line_of(key), where, "must be a mapping")
                out[key] = self._validate(value, rule, where)
                continue
            try:
                out[key] = rule(value)
            except ValueError as exc:
                raise self.fail(node.line_of(key), where, f"{exc} (got {_shown(value)})") from None
        return out

    def host(self, name: str, group: str, hvars: LocatedDict, line: int, accept_new: bool) -> Host:
        """A Host from merged vars; paths it names are checked here, so errors still have a line."""
        ssh = hvars.get("ssh", LocatedDict())
        base = self.path.parent
        for key in ("key", "known_hosts"):
            value = _relative_to(base, ssh.get(key))
            if value is not None and os.path.isdir(os.path.expanduser(value)):
                raise self.fail(ssh.line_of(key), f"ssh.{key}", f"{value} is a directory; name a file")
        if hvars.get("transport") == "local" and "address" in hvars:
            raise self.fail(hvars.line_of("address"), f"{name}.address", f"{hvars['address']} is never reached: "
                            "transport: local works on this machine; drop the address, or the transport for SSH")
        profile_line = hvars.lines.get("profile")
        return _build_host(name, group, hvars, f"{self.path}:{line}", accept_new,
                           f"{self.path}:{profile_line}" if profile_line else "")


def _shown(value: Any, limit: int = 60, quote: bool = True) -> str:
    """A value as it goes into an error message: repr (control characters escaped), cut short."""
    text = repr(value) if quote or not isinstance(value, str) else repr(value)[1:-1]
    return text if len(text) <= limit else text[:limit] + "...(cut)"


def _merge(*layers: dict) -> LocatedDict:
    """Later layers win key by key; each key keeps the line of the layer that set it."""
    merged = LocatedDict()
    for layer in layers:
        merged.line = getattr(layer, "line", merged.line)
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = _merge(merged[key], value)
            else:
                merged[key] = value
            if isinstance(layer, LocatedDict):
                merged.lines[key] = layer.line_of(key)
    return merged


def _relative_to(base: Path, value: str | None) -> str | None:
    """Key and known_hosts paths in an inventory are relative to the inventory file."""
    if value is None or value.startswith(("/", "~")):
        return value
    return str(base / value)


def _build_host(name: str, group: str, hvars: dict, source: str, accept_new: bool, profile_source: str = "") -> Host:
    ssh = hvars.get("ssh", {})
    base = Path(source.rsplit(":", 1)[0]).parent
    transport = hvars.get("transport") or ("local" if name == "localhost" and "address" not in hvars else "ssh")
    spec = ConnectionSpec(
        host_name=name,
        transport=transport,
        address=hvars.get("address", name),
        port=ssh.get("port", 22),
        user=ssh.get("user"),
        key=_relative_to(base, ssh.get("key")),
        known_hosts=_relative_to(base, ssh.get("known_hosts")),
        timeout_s=ssh.get("timeout", 10.0),
        become=ssh.get("become", False),
        accept_new_host_keys=accept_new,
    )
    return Host(
        name=name,
        group=group,
        connection=spec,
        profile=hvars.get("profile", DEFAULT_PROFILE),
        pins=Pins(**hvars.get("pins", {})),
        gpus=hvars.get("gpus", "all"),
        irq_cores=hvars.get("irq_cores"),
        rcu_nocbs=hvars.get("rcu_nocbs"),
        tune=hvars.get("tune", LocatedDict()),
        deploy=dict(hvars.get("deploy", {})),
        source=source,
        probe_timeout_s=hvars.get("probe_timeout", 60.0),
        profile_source=profile_source,
    )


def _no_duplicates(hosts: list[Host]) -> None:
    """One machine is one host: two names for one SSH address and port, or two local hosts, would be probed,
    planned and changed twice at once (two applies racing on the same files and journal)."""
    seen: dict[str, Host] = {}
    machines: dict[tuple[str, int], Host] = {}
    local: Host | None = None
    for host in hosts:
        if host.name in seen:
            raise InventoryError(f"{host.source}: host {host.name!r} is already defined at {seen[host.name].source}")
        seen[host.name] = host
        if host.connection.transport == "local":
            if local is not None:
                raise InventoryError(f"{host.source}: host {host.name!r} is this machine (transport: local), as host "
                                     f"{local.name!r} at {local.source} is; name this machine once")
            local = host
        if host.connection.transport != "ssh":
            continue
        machine = (host.connection.address.lower().rstrip("."), host.connection.port)
        if machine in machines:
            other = machines[machine]
            raise InventoryError(f"{host.source}: host {host.name!r} is {machine[0]} port {machine[1]}, as host "
                                 f"{other.name!r} at {other.source} is; name each machine once")
        machines[machine] = host
