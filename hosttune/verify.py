"""`hosttune verify`: run the testinfra suite (tests/host) against an inventory's hosts.

The suite inspects hosts with testinfra's own modules (files, services, packages, sysctls)
over the ssh client, never through hosttune's probes, so it is an independent witness of
what apply did. hosttune only hands it the desired state (from the profiles) and an ssh
config built from the inventory, with host keys checked.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from hosttune.actions.platform import Apt, Dnf
from hosttune.errors import HosttuneError, TransportError
from hosttune.config.inventory import Host, Inventory
from hosttune.config.profile import Profile
from hosttune.fleet_runner import EXIT_ERROR, FleetRunner
from hosttune.transport import open_transport

EXPECT_ENV = "HOSTTUNE_VERIFY_EXPECT"
PYTEST_NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED (pytest is an optional extra, not imported here)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def suite_dir() -> Path:
    """tests/host in a source checkout, hosttune/host_tests inside the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "host_tests", here.parent / "tests" / "host"):
        if (candidate / "conftest.py").exists():
            return candidate
    raise HosttuneError("the testinfra suite (tests/host) is not installed with this hosttune")


def expectations(profile: Profile) -> dict:
    """The desired state the suite checks, from the profile alone."""
    pin = profile.driver.version
    names = {f.name: list(profile.driver.packages or f.driver_packages(pin)) for f in (Apt(), Dnf())} if pin else {}
    return {
        "profile": profile.name,
        "irqbalance": profile.irq.irqbalance,
        "gpu_irq_cores": profile.irq.gpu_affinity,
        "numa_balancing": None if profile.numa.balancing is None else int(profile.numa.balancing),
        "thp": profile.memory.thp,
        "governor": profile.cpu.governor,
        "max_cstate": profile.cpu.max_cstate,
        "rcu_nocbs": profile.kernel.rcu_nocbs,
        "nvme_apst": profile.nvme.apst,
        "persistence": profile.gpu.persistence,
        "driver": {"version": pin, "held": profile.driver.held, "packages": names},
        "cuda": profile.cuda.toolkit,
        "numactl": profile.tools.numactl,
        "python": profile.tools.python,
    }


def _value(value: str, what: str, host: Host) -> str:
    """One ssh_config value, quoted; anything that could start another directive is refused."""
    if any(c in value for c in '"\n\r\t\0') or not value.isprintable():
        raise HosttuneError(f"{host.source}: {host.name}: {what} {value!r} cannot be written to an ssh config")
    return f'"{value}"'


def ssh_config(hosts: list[Host], control_dir: str, accept_new_host_keys: bool) -> str:
    blocks = []
    for host in hosts:
        c = host.connection
        lines = [f"Host {host.name}", f"  HostName {_value(c.address, 'address', host)}", f"  Port {c.port}"]
        if c.user:
            lines.append(f"  User {_value(c.user, 'ssh.user', host)}")
        if c.key:
            lines += [f"  IdentityFile {_value(os.path.expanduser(c.key), 'ssh.key', host)}", "  IdentitiesOnly yes"]
        known = os.path.expanduser(c.known_hosts or "~/.ssh/known_hosts")
        lines += [
            f"  UserKnownHostsFile {_value(known, 'ssh.known_hosts', host)}",
            f"  StrictHostKeyChecking {'accept-new' if accept_new_host_keys else 'yes'}",
            "  BatchMode yes", f"  ConnectTimeout {math.ceil(c.timeout_s)}", f"  ControlPath {control_dir}/%C",
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def host_spec(host: Host, config: Path) -> str:
    if host.connection.transport == "local":
        return "local://"
    sudo = "&sudo=true" if host.connection.become else ""
    return f"ssh://{host.name}?ssh_config={config}{sudo}"


def _key(host: Host) -> str:
    return "local" if host.connection.transport == "local" else host.name


def _reach(host: Host) -> str | None:
    """Connect once with hosttune's own host-key check, and with become: true run one command as root; the
    reason when either fails (else every test of the suite fails with the same sudo error)."""
    try:
        with open_transport(host.connection, read_only=True) as transport:
            transport.connect()
            root = transport.read(["true"], timeout=host.connection.timeout_s) if host.connection.become else None
    except TransportError as exc:
        return str(exc)
    if root is not None and not root.ok:
        return f"{host.name}: become: true cannot run commands as root: {(root.stderr.strip() or f'exit {root.rc}')[-300:]}"
    return None


def preflight(hosts: list[Host]) -> None:
    """Unknown or changed host keys and unreachable hosts are one line each here, not a page of ssh errors per test."""
    remote = [h for h in hosts if h.connection.transport != "local"]
    if not remote:
        return
    problems = [p for p in FleetRunner(forks=32).map(_reach, remote) if p]
    if problems:
        raise HosttuneError("; ".join(problems) + "; nothing was verified: leave these hosts out with --limit "
                            "to verify the others")


def _exit_code(code: int) -> int:
    """pytest's exit code as hosttune's: 0 every host verified, 1 a test failed, else 2. pytest's 4 (a usage
    error) must not read as hosttune's unreachable bit, nor its 5 (no test selected) as a verdict."""
    if code == PYTEST_NO_TESTS:
        raise HosttuneError("no test ran: the pytest arguments after -- selected none, so nothing was verified")
    return code if code in (0, 1) else EXIT_ERROR


def run_verify(inventory: Inventory, profiles: dict[str, Profile], *, junit_xml: Path | None = None,
               accept_new_host_keys: bool = False, pytest_args: tuple[str, ...] = ()) -> int:
    """pytest tests/host --hosts=... ; 0 when every host is verified, 1 when a test failed, 2 when pytest could not run."""
    if importlib.util.find_spec("testinfra") is None or importlib.util.find_spec("pytest") is None:
        raise HosttuneError("hosttune verify needs pytest and pytest-testinfra: pip install 'hosttune[verify]'")
    hosts = list(inventory.hosts)
    for host in hosts:
        if not _NAME.match(host.name):
            raise HosttuneError(f"{host.source}: host name {host.name!r} cannot be used as an ssh alias")
    preflight(hosts)
    with tempfile.TemporaryDirectory(prefix="hosttune-verify-") as tmp:
        config = Path(tmp) / "ssh_config"
        config.write_text(ssh_config(hosts, tmp, accept_new_host_keys))
        expect = Path(tmp) / "expect.json"
        expect.write_text(json.dumps({_key(h): expectations(profiles[h.name]) for h in hosts}, indent=1))
        argv = [sys.executable, "-m", "pytest", str(suite_dir()), "-p", "no:cacheprovider", "-q",
                "--rootdir", str(suite_dir()), "-c", os.devnull, "--hosts", ",".join(host_spec(h, config) for h in hosts)]
        if junit_xml:
            argv.append(f"--junit-xml={junit_xml}")
        env = {**os.environ, EXPECT_ENV: str(expect)}
        try:
            return _exit_code(subprocess.run([*argv, *pytest_args], env=env, check=False).returncode)
        finally:
            for host in hosts:
                if host.connection.transport != "local":  # stop the ssh control masters testinfra left
                    subprocess.run(["ssh", "-F", str(config), "-O", "exit", host.name], capture_output=True, check=False)
