"""A host that runs several replicas, as files: one templated unit (hosttune-engine@.service) whose
instances read their GPUs, NUMA node and port from an environment file each; the host-local
nginx upstream over them on the service port; the probe's service and timer; the Prometheus
targets of every replica's /metrics.

Pure: the release is data (plan.make_layout_release hashes and names it); rolling.py puts it live.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from hosttune.build.wheelhouse import Entry
from hosttune.deploy.placement import Layout, Placement
from hosttune.deploy.plan import Role, make_release, named_release, placeholder_values, serve_argv, serve_flags
from hosttune.deploy.release import VENV_PLACEHOLDER, Release, meta_dir, release_dir
from hosttune.deploy.settings import ServeSettings, drain_seconds
from hosttune.deploy.units import (REPLICA_TEMPLATE, UnitSpec, Upstream, render_nginx, render_probe_units, render_unit,
                                   variable)
from hosttune.presets import EnginePreset

NGINX_CONF = "/etc/nginx/conf.d/hosttune-local.conf"
SERVERS_FILE = "/etc/hosttune/nginx/local-servers.conf"
SCRAPE_FILE = "/etc/hosttune/prometheus/hosttune-replicas.json"
STATE_DIR = "/run/hosttune/lb"
LB_SCRIPT = "replica_lb.py"
REPLICAS_JSON = "replicas.json"
PROBE_TIMEOUT_S = 30
PORT_VAR, NUMA_VAR = "HOSTTUNE_PORT", "HOSTTUNE_NUMA"


@lru_cache(maxsize=1)
def lb_script() -> bytes:
    return resources.files("hosttune.deploy").joinpath(LB_SCRIPT).read_bytes()


def env_file(index: int) -> str:
    return f"replica-{index}.env"


def _numactl_prefix(layout: Layout) -> tuple[str, ...]:
    """Bound to ${HOSTTUNE_NUMA} when every replica knows its node; otherwise none is bound."""
    first = layout.replicas[0]
    if not all(r.numa_nodes and r.numactl for r in layout.replicas):
        return ()
    return (first.numactl, f"--cpunodebind={variable(NUMA_VAR)}", f"--membind={variable(NUMA_VAR)}")


def template_spec(preset: EnginePreset, settings: ServeSettings, layout: Layout, venv: str) -> UnitSpec:
    first = layout.replicas[0]
    values = placeholder_values(preset, settings, first, venv, Role(), port=variable(PORT_VAR))
    flags = serve_flags(preset, settings, first)
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **settings.env}
    return UnitSpec(REPLICA_TEMPLATE, f"hosttune {preset.name} engine replica serving {settings.model}",
                    (*_numactl_prefix(layout), *serve_argv(preset, flags, values)), env, venv,
                    drain_seconds(preset, flags), environment_files=(f"{meta_dir(_rid(venv))}/replica-%i.env",),
                    variables=(PORT_VAR, NUMA_VAR))


def _rid(venv: str) -> str:
    return venv.rstrip("/").rsplit("/", 1)[-1]


def replica_env(replica: Placement) -> bytes:
    lines = [f"{PORT_VAR}={replica.port}"]
    if replica.gpus:
        lines.append(f"CUDA_VISIBLE_DEVICES={replica.cuda_visible_devices}")
    if replica.numa_nodes:
        lines.append(f"{NUMA_VAR}={','.join(map(str, replica.numa_nodes))}")
    return ("\n".join(lines) + "\n").encode()


def replicas_doc(layout: Layout) -> list[dict]:
    return [{"index": r.index, "port": r.port, "gpus": list(r.gpus), "numa_nodes": list(r.numa_nodes)}
            for r in layout.replicas]


def lb_config(layout: Layout, upstream: Upstream) -> bytes:
    doc = {"replicas": replicas_doc(layout), "servers_file": SERVERS_FILE, "state_dir": STATE_DIR,
           "max_fails": upstream.max_fails, "fail_timeout_s": upstream.fail_timeout_s, "probe_timeout_s": PROBE_TIMEOUT_S}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def local_upstream(preset: EnginePreset, settings: ServeSettings, layout: Layout) -> Upstream:
    return Upstream("local", preset.name, (), listen=settings.port, session_affinity=settings.session_affinity,
                    servers_file=SERVERS_FILE, tries=len(layout.replicas))


def scrape_targets(layout: Layout, address: str, host: str, engine: str) -> bytes:
    """Prometheus file_sd targets: every replica's /metrics (file_sd_configs in prometheus.yml)."""
    doc = [{"targets": [f"{address}:{r.port}"],
            "labels": {"job": "hosttune", "host": host, "engine": engine, "replica": str(r.index),
                       "gpus": ",".join(map(str, r.gpus))}} for r in layout.replicas]
    return (json.dumps(doc, indent=1) + "\n").encode()


def replica_files(preset: EnginePreset, settings: ServeSettings, layout: Layout, venv: str, address: str,
                  host: str) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    """(units, files of the release's .hosttune/, host files by path) of a balanced layout."""
    spec = template_spec(preset, settings, layout, venv)
    rid = _rid(venv)
    units = {REPLICA_TEMPLATE: render_unit(spec, rid)}
    probe = ("/usr/bin/env", "python3", f"{meta_dir(rid)}/{LB_SCRIPT}", "probe")
    units.update(render_probe_units(rid, probe, settings.probe_interval_s, PROBE_TIMEOUT_S * len(layout.replicas) + 30))
    upstream = local_upstream(preset, settings, layout)
    meta = {env_file(r.index): replica_env(r) for r in layout.replicas}
    meta.update({LB_SCRIPT: lb_script(), REPLICAS_JSON: lb_config(layout, upstream)})
    files = {NGINX_CONF: render_nginx(upstream), SCRAPE_FILE: scrape_targets(layout, address, host, preset.name)}
    return units, meta, files


def make_layout_release(preset: EnginePreset, settings: ServeSettings, layout: Layout, entry: Entry,
                        address: str = "127.0.0.1", host: str = "") -> Release:
    """One replica: the single service (plan.make_release); several: the templated unit and its nginx."""
    if not layout.is_balanced:
        return make_release(preset, settings, layout.replicas[0], entry)
    venv = release_dir(VENV_PLACEHOLDER)
    units, meta, files = replica_files(preset, settings, layout, venv, address, host)
    summary = {"model": settings.model, "port": settings.port, "tensor_parallel": layout.tensor_parallel,
               "replicas": replicas_doc(layout), "flags": settings.flags, "env": settings.env}
    spec = template_spec(preset, settings, layout, venv)
    program = spec.argv[len(_numactl_prefix(layout))]
    return named_release(preset, entry, units, summary, (program,), meta, files)
