"""A host that runs several replicas, as files: one templated unit (hosttune-engine@.service) whose
instances read their GPUs, NUMA node and port from an environment file each; the host-local
nginx upstream over them on the service port; the probe's service and timer; the Prometheus
targets of every replica's /metrics.

Pure: the release is data (plan.make_layout_release hashes and names it); rolling.py puts it live.
"""

from __future__ import annotations

import json

from hosttune.build.wheelhouse import Entry
from hosttune.deploy.access import Access
from hosttune.deploy.front import LOOPBACK, NGINX_CONF, front_upstream, on_loopback
from hosttune.deploy.placement import Layout, Placement
from hosttune.deploy.plan import (Role, key_env_files, key_summary, make_release, named_release, placeholder_values,
                                  serve_argv, serve_flags)
from hosttune.deploy.release import CURRENT, VENV_PLACEHOLDER, Release, meta_dir, release_dir
from hosttune.deploy.router import (RouterPorts, render_router_unit, router_files, router_ports, router_targets,
                                    router_upstream)
from hosttune.deploy.settings import ServeSettings, drain_seconds
from hosttune.deploy.units import (REPLICA_TEMPLATE, ROUTER_UNIT, UnitSpec, Upstream, render_nginx, render_probe_units,
                                   render_unit, variable)
from hosttune.presets import EnginePreset, load_router
from hosttune.transport.base import bundled_script

SERVERS_FILE = "/etc/hosttune/nginx/local-servers.conf"
SCRAPE_FILE = "/etc/hosttune/prometheus/hosttune-replicas.json"
STATE_DIR = "/run/hosttune/lb"
LB_SCRIPT = "replica_lb.py"
SEVERAL_MARK = b"\nTAKES_SEVERAL = True\n"  # in a replica_lb.py whose out and in take several replicas
REPLICAS_JSON = "replicas.json"
PROBE_TIMEOUT_S = 30
PORT_VAR, NUMA_VAR = "HOSTTUNE_PORT", "HOSTTUNE_NUMA"


def lb_script() -> bytes:
    """replica_lb.py as the host runs it: after host_key.py, which reads the key its probe sends."""
    return (bundled_script("hosttune.deploy", "host_key.py") + "\n\n" + bundled_script("hosttune.deploy", LB_SCRIPT)).encode()


def env_file(index: int) -> str:
    return f"replica-{index}.env"


def _numactl_prefix(layout: Layout) -> tuple[str, ...]:
    """Bound to ${HOSTTUNE_NUMA} when every replica knows its node; otherwise none is bound."""
    first = layout.replicas[0]
    if not all(r.numa_nodes and r.numactl for r in layout.replicas):
        return ()
    return (first.numactl, f"--cpunodebind={variable(NUMA_VAR)}", f"--membind={variable(NUMA_VAR)}")


def template_spec(preset: EnginePreset, settings: ServeSettings, layout: Layout, venv: str,
                  access: Access = Access()) -> UnitSpec:
    first = layout.replicas[0]
    values = placeholder_values(preset, settings, first, venv, Role(), port=variable(PORT_VAR))
    flags = serve_flags(preset, settings, first)
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **settings.env}
    return UnitSpec(REPLICA_TEMPLATE, f"hosttune {preset.name} engine replica serving {settings.model}",
                    (*_numactl_prefix(layout), *serve_argv(preset, flags, values, access)), env, venv,
                    drain_seconds(preset, flags),
                    environment_files=(f"{meta_dir(_rid(venv))}/replica-%i.env", *key_env_files(access)),
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


def lb_config(layout: Layout, upstream: Upstream, access: Access, router: RouterPorts | None = None,
              health: str = "/health") -> bytes:
    """replica_lb.py's settings; the probe reads the key from key_file, the replicas' own environment file.
    With a router, replica_lb.py adds and removes the replicas there instead of in nginx's servers file."""
    doc = {"replicas": replicas_doc(layout), "servers_file": SERVERS_FILE, "state_dir": STATE_DIR,
           "key_file": access.env_file,
           "max_fails": upstream.max_fails, "fail_timeout_s": upstream.fail_timeout_s, "probe_timeout_s": PROBE_TIMEOUT_S}
    if router:
        doc.update(router=router.url, health=health)
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def local_upstream(preset: EnginePreset, settings: ServeSettings, layout: Layout, access: Access = Access()) -> Upstream:
    """The host's nginx front over the replicas: on the service port, or deploy.nginx's port and TLS."""
    return front_upstream(access, preset.name, listen=settings.port, servers_file=SERVERS_FILE,
                          session_affinity=settings.session_affinity, tries=len(layout.replicas))


def scrape_targets(layout: Layout, host: str, engine: str, router: RouterPorts | None = None) -> bytes:
    """Prometheus file_sd targets: every replica's /metrics (file_sd_configs in prometheus.yml), and the
    router's. They listen on the loopback address only, so the scraper (or its agent) runs on the host."""
    doc = [{"targets": [f"{LOOPBACK}:{r.port}"],
            "labels": {"job": "hosttune", "host": host, "engine": engine, "replica": str(r.index),
                       "gpus": ",".join(map(str, r.gpus))}} for r in layout.replicas]
    doc += router_targets(router, host, engine) if router else []
    return (json.dumps(doc, indent=1) + "\n").encode()


def replica_files(preset: EnginePreset, settings: ServeSettings, layout: Layout, venv: str, host: str,
                  access: Access) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    """(units, files of the release's .hosttune/, host files by path) of a balanced layout."""
    spec = template_spec(preset, settings, layout, venv, access)
    rid = _rid(venv)
    units = {REPLICA_TEMPLATE: render_unit(spec, rid)}
    probe = ("/usr/bin/env", "python3", f"{meta_dir(rid)}/{LB_SCRIPT}", "probe")
    units.update(render_probe_units(rid, probe, settings.probe_interval_s, PROBE_TIMEOUT_S * len(layout.replicas) + 30))
    router = router_ports(layout) if settings.router else None
    upstream = local_upstream(preset, settings, layout, access)
    if router:
        units[ROUTER_UNIT] = router_unit(preset, router)
        upstream = router_upstream(access, preset.name, settings.port, router, layout)
    meta = {env_file(r.index): replica_env(r) for r in layout.replicas}
    meta.update({LB_SCRIPT: lb_script(), REPLICAS_JSON: lb_config(layout, upstream, access, router, preset.serve.health)})
    meta.update(router_files(load_router()) if router else {})
    files = {NGINX_CONF: render_nginx(upstream), SCRAPE_FILE: scrape_targets(layout, host, preset.name, router)}
    return units, meta, files


def router_unit(preset: EnginePreset, router: RouterPorts) -> bytes:
    """The router's unit: its replicas synced by the live release's replica_lb.py once it answers."""
    sync = ("/usr/bin/env", "python3", f"{CURRENT}/.hosttune/{LB_SCRIPT}", "sync")
    return render_router_unit(load_router(), router, preset.serve.health, sync)


def make_layout_release(preset: EnginePreset, settings: ServeSettings, layout: Layout, entry: Entry, host: str = "",
                        access: Access = Access(), shape: dict | None = None) -> Release:
    """One replica: the single service (plan.make_release); several: the templated unit and its nginx.

    shape: what the release records as its shape, for the next deploy."""
    if not layout.is_balanced:
        return make_release(preset, settings, layout.replicas[0], entry, access=access, shape=shape)
    settings = on_loopback(settings)  # the replicas are behind the host's nginx
    venv = release_dir(VENV_PLACEHOLDER)
    units, meta, files = replica_files(preset, settings, layout, venv, host, access)
    summary = key_summary({"model": settings.model, "port": settings.port, "tensor_parallel": layout.tensor_parallel,
                           "replicas": replicas_doc(layout), "flags": settings.flags, "env": settings.env}, access)
    if settings.router:
        summary["router"] = {"policy": load_router().policy, "port": router_ports(layout).listen}
    if shape:
        summary["shape"] = shape
    spec = template_spec(preset, settings, layout, venv, access)
    programs = (spec.argv[len(_numactl_prefix(layout))],) + ((f"{venv}/bin/python",) if settings.router else ())
    return named_release(preset, entry, units, summary, programs, meta, files)
