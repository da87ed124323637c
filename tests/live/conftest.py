"""Fixtures for live tests: real Debian systemd hosts (systemd-nspawn) over real SSH.

Fixtures
- live_image  (session): the cached debootstrap root (built on first use, ~1 min).
- live_fleet  (session): the Fleet that owns every container of this run; killed at the end.
- live_hosts  (session): two booted hosts, "alpha" and "beta", shared by all live tests.
                         Leave them as you found them (see fleet.stopped(host)).
- fresh_hosts (function): factory, fresh_hosts(["a", "b"], binds=...) boots private
                         hosts for one test (~0.5 s) and removes them after it.
- live_known_hosts (function): a known_hosts file for live_hosts in tmp_path.
- tiny_model, wheelhouse (session): the deploy tests' tiny model folder and the bundled
                         engine's wheelhouse with its dependency wheels (deploy_setup.py), made
                         once a run and shared by the xdist workers.

Order: scripts/test.sh runs the live files two at once (--dist loadfile, --no-loadscope-reorder), each handed
whole to whichever worker asks next, in the order collected. The files that say how long they take (marked
live_seconds(N), N their seconds on CI) come first, longest first, so none of them starts last while the
other worker idles; the rest follow as collected.

Live tests skip when not root or systemd-nspawn is missing. With HOSTTUNE_REQUIRE_LIVE=1
(scripts/test.sh sets it when it runs as root) a missing prerequisite fails instead, so CI
cannot silently skip them.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .deploy_setup import build_wheelhouse, built_once, make_tiny_model
from .hosts import Fleet, sweep_stale_runs
from .image import ensure_image

_timings: list[str] = []


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "live tests boot systemd-nspawn containers and need root"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is missing (apt-get install systemd-container)"
    return None


@pytest.fixture(scope="session")
def live_image():
    missing = _missing_prerequisite()
    if missing:
        if os.environ.get("HOSTTUNE_REQUIRE_LIVE") == "1":
            pytest.fail(f"HOSTTUNE_REQUIRE_LIVE=1 but {missing}")
        pytest.skip(missing)
    image = ensure_image()
    cached = "from cache" if image.build_s == 0 else f"debootstrap {image.build_s:.1f}s"
    _timings.append(f"image {image.root.name}: {cached}")
    return image


@pytest.fixture(scope="session")
def live_fleet(live_image):
    swept = sweep_stale_runs()
    if swept:
        _timings.append(f"swept leftovers of dead runs: {', '.join(swept)}")
    fleet = Fleet(live_image)
    try:
        yield fleet
    finally:
        for name, t in fleet.timings.items():
            boot = "did not boot" if t.boot_s is None else f"boot to ssh {t.boot_s:.2f}s"
            _timings.append(f"{name}: root ({t.root_mode}) {t.root_s:.3f}s, {boot}")
        fleet.close()


@pytest.fixture(scope="session")
def live_hosts(live_fleet):
    return live_fleet.boot(["alpha", "beta"])


@pytest.fixture
def fresh_hosts(live_fleet):
    booted = []

    def boot(names, **kwargs):
        hosts = live_fleet.boot(names, **kwargs)
        booted.extend(hosts)
        return hosts

    yield boot
    for host in booted:
        live_fleet.remove(host)


@pytest.fixture
def live_known_hosts(live_fleet, live_hosts, tmp_path) -> Path:
    return live_fleet.write_known_hosts(tmp_path / "known_hosts", live_hosts)


def _longest_first(item) -> float:
    marker = item.get_closest_marker("live_seconds")
    return -marker.args[0] if marker else 0.0


def pytest_collection_modifyitems(items):
    """The live tests longest file first (see the module's docstring), where they were among the items."""
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if item.path.is_relative_to(here)]
    for i, item in zip(places, sorted((items[i] for i in places), key=_longest_first)):
        items[i] = item


def pytest_terminal_summary(terminalreporter):
    if _timings:
        terminalreporter.write_sep("-", "live hosts")
        for line in _timings:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "models", make_tiny_model)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "wheelhouse", build_wheelhouse)
