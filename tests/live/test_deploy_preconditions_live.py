"""A deploy checks what it needs on a real systemd host over SSH before it sends anything.

One Debian host without python3-venv: the dry run plans its install before any upload; with no
package lists the deploy stops at plan time and uploads nothing; the real deploy installs it and
serves. Then a model folder without config.json is refused at plan time while `hosttune bench`
runs against the live release: every request of the run is answered.
"""
from __future__ import annotations

import shutil
import time

import pytest

from .deploy_setup import MODEL, free_port, served, wait_for
from .steady_bench import bench_run, start_bench, stop_bench
from .test_deploy_live import complete, deploy

pytestmark = [pytest.mark.live, pytest.mark.timeout(1500), pytest.mark.live_seconds(55)]


def uploaded(host) -> int:
    """Bytes deploy has put under /opt/hosttune (wheels, releases)."""
    out = host.exec("du -sb /opt/hosttune 2>/dev/null || echo 0", check=False).stdout.split()
    return int(out[0]) if out else 0


def test_deploy_checks_python_venv_and_the_model_before_anything_is_sent(live_fleet, fresh_hosts, tmp_path, wheelhouse,
                                                                         tiny_model, capsys):
    (host,) = fresh_hosts(["novenv"])
    shutil.copytree(tiny_model, host.path(MODEL))
    host.exec("apt-get remove -y -q python3-venv python3.11-venv >/dev/null")
    assert host.exec("python3 -c 'import ensurepip'", check=False).returncode != 0
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inventory = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host], user="deploy", become=True)
    port = free_port()
    timings = {}

    # 1. the dry run plans python3-venv's install first, before any wheel is uploaded
    result, timings["dry run"] = deploy(inventory, wheelhouse, port, "--dry-run")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "checked on the host before anything is sent:" in lines
    assert any(line.startswith("added: install python3-venv: python3 cannot make a virtualenv") for line in lines)
    install = next(i for i, line in enumerate(lines) if line.startswith("$ env DEBIAN_FRONTEND=noninteractive apt-get install"))
    assert install < next(i for i, line in enumerate(lines) if line.startswith("upload ")) and lines[install].endswith(" python3-venv")
    assert uploaded(host) == 0

    # 2. no package lists, so nothing can install it: one line at plan time, exit 2, not a byte uploaded
    host.exec("mv /var/lib/apt/lists /var/lib/apt/lists.off && mkdir -p /var/lib/apt/lists/partial")
    result, timings["refused"] = deploy(inventory, wheelhouse, port)
    host.exec("rm -rf /var/lib/apt/lists && mv /var/lib/apt/lists.off /var/lib/apt/lists")
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stdout.splitlines() if "nothing changed" in line]
    assert "nothing changed: novenv: python3 cannot make a virtualenv" in line
    assert "python3-venv is not in the host's package lists: install python3-venv" in line
    assert uploaded(host) == 0 and host.exec("test -e /opt/hosttune", check=False).returncode != 0

    # 3. the deploy installs python3-venv, then the release, and serves
    result, timings["deploy"] = deploy(inventory, wheelhouse, port)
    assert result.exit_code == 0, result.output
    assert host.exec("dpkg-query -W -f '${Status}' python3-venv").stdout == "install ok installed"
    release = result.stdout.splitlines()[0].split()[2]
    complete(port, MODEL)

    # 4. a model folder without config.json: refused at plan time; the live release answers every request meanwhile
    noconfig = "/srv/models/noconfig"
    shutil.copytree(tiny_model, host.path(noconfig), ignore=shutil.ignore_patterns("config.json"))
    before = served(port)
    bench = start_bench(port, tmp_path / "bench", max_tokens=4)
    wait_for("the bench's first requests", lambda: served(port) >= before + 3, 120)
    refused_at = time.monotonic()
    result, timings["refused model"] = deploy(inventory, wheelhouse, port, model=noconfig)
    refused_by = time.monotonic()
    assert result.exit_code == 2, result.output
    assert f"nothing changed: novenv: the model folder {noconfig} has no readable config.json" in result.stdout
    time.sleep(4)  # the live release keeps answering after it too
    bench_out = stop_bench(bench)
    run = bench_run(tmp_path / "bench")
    requests = run["requests"]
    bad = [(r["outcome"], r["status"], r["error"]) for r in requests if r["outcome"] != "ok" or r["status"] != 200]
    assert len(requests) >= 10 and not bad, (bad[:10], bench_out[-2000:])
    sent = [run["clock_origin"] + r["sent"] for r in requests]  # the bench's clock is this process's monotonic one
    assert min(sent) < refused_at and max(sent) > refused_by, "the load spans the refused deploy"
    assert host.exec("readlink /opt/hosttune/current").stdout.strip() == f"/opt/hosttune/releases/{release}"
    assert noconfig not in host.path("/etc/systemd/system/hosttune-serve.service").read_text()
    with capsys.disabled():
        print("\n  deploy preconditions: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
              + f", {len(requests)} requests all answered")
