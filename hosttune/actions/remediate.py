"""The remediation ladder's operations: restart a unit, drain and restore a replica, reset or diagnose a GPU,
cordon and uncordon a host, keep the ledger. Data only: `hosttune.execute` runs them.

A replica is addressed through the live release's replica_lb.py on the host (`lb`, its path), the same
script deploy drains replicas with for a rolling restart.
"""

from __future__ import annotations

from hosttune.actions.base import Command, FileWrite, Op, Remove

CORDON_FILE = "/var/lib/hosttune/cordon.json"
LEDGER_FILE = "/var/lib/hosttune/remediate/ledger.json"

# Waits (bounded) until no connection to the replica's port is still open: nginx has stopped sending
# it requests, and the ones in flight have finished. $1 the port, $2 the seconds to wait at most.
WAIT_IDLE = ('end=$(( $(date +%s) + $2 )); '
             'while [ "$(date +%s)" -lt "$end" ]; do '
             'ss -Htn state established "( sport = :$1 )" | grep -q . || exit 0; sleep 0.5; done; '
             'echo "port $1 still had connections after $2 s; stopping it drains the rest" >&2')

# Waits (bounded) for the replica on port $1 to answer /health with 200 (every engine preset's health path),
# so it goes back into the front ready; $2 the seconds to wait at most.
WAIT_HEALTHY = ('end=$(( $(date +%s) + $2 )); '
                'while [ "$(date +%s)" -lt "$end" ]; do '
                'python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" '
                '"http://127.0.0.1:$1/health" 2>/dev/null && exit 0; sleep 1; done; '
                'echo "the replica on port $1 did not answer /health within $2 s: left out of the front" >&2; exit 1')

# Resets GPU $1 only when no process holds it (the drain stopped its replicas; anything left is not ours).
RESET_IDLE = ('apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$1") || exit $?; '
              'if [ -n "$apps" ]; then echo "GPU $1 is held by process(es) $(echo $apps): not reset" >&2; exit 3; fi; '
              'nvidia-smi -r -i "$1"')


def lb(script: str, command: str, index: int, undo: str | None = None) -> Command:
    """replica_lb.py on the host: one replica out of or into the host-local nginx upstream (undo: the opposite)."""
    return Command(("python3", script, command, str(index)), undo=("python3", script, undo, str(index)) if undo else None,
                   offline=False, timeout=120.0)


def restart_ops(units: tuple[str, ...]) -> list[Op]:
    return [Command(("systemctl", "restart", *units), offline=False, timeout=300.0)]


def drain_ops(script: str | None, index: int, unit: str, port: int, wait_s: int) -> list[Op]:
    """Out of the front, in-flight requests finished (bounded), then stopped so its GPU is free."""
    front = [lb(script, "out", index, undo="in"),
             Command(("sh", "-c", WAIT_IDLE, "wait-idle", str(port), str(wait_s)), offline=False, timeout=wait_s + 30.0)]
    return (front if script else []) + [Command(("systemctl", "stop", unit), undo=("systemctl", "start", unit),
                                                offline=False, timeout=900.0)]


def restore_ops(script: str | None, index: int, unit: str, port: int, wait_s: int) -> list[Op]:
    """Started again, healthy (bounded wait), and back in the front."""
    start = Command(("systemctl", "start", unit), offline=False, timeout=900.0)
    if not script:
        return [start]
    healthy = Command(("sh", "-c", WAIT_HEALTHY, "wait-healthy", str(port), str(wait_s)), offline=False, timeout=wait_s + 30.0)
    return [start, healthy, lb(script, "in", index)]


def reset_ops(gpu: int) -> list[Op]:
    return [Command(("sh", "-c", RESET_IDLE, "reset-gpu", str(gpu)), offline=False, timeout=300.0)]


def diagnose_ops(gpu: int) -> list[Op]:
    # dcgmi prints its results as a table on stdout: a failed test is a row whose result reads Fail
    return [Command(("dcgmi", "diag", "-r", "2", "-i", str(gpu)), offline=False, timeout=900.0,
                    fail_on_stderr=("Fail",), fail_on_stdout=("| Fail",))]


def cordon_ops(record: bytes, script: str | None, indices: tuple[int, ...], services: tuple[str, ...] = ()) -> list[Op]:
    """The cordon file (deploy refuses the host), every replica out of the host's front, and the services of a
    host without replicas stopped (no front can take them out; a reboot rung has started them again)."""
    front = [lb(script, "out", i, undo="in") for i in indices] if script else []
    stop = [Command(("systemctl", "stop", u), undo=("systemctl", "start", u), offline=False, timeout=900.0) for u in services]
    return [FileWrite(CORDON_FILE, record, 0o644), *front, *stop]


def uncordon_ops(script: str | None, replicas: tuple[tuple[int, str, int], ...], wait_s: int,
                 services: tuple[str, ...] = ()) -> list[Op]:
    """Each replica (index, unit, port) started, healthy and back in the front, the services of a host without
    replicas started, and then the cordon file gone: a replica that does not come back leaves the host cordoned."""
    restored = [op for i, unit, port in replicas for op in restore_ops(script, i, unit, port, wait_s)]
    started = [Command(("systemctl", "start", u), offline=False, timeout=900.0) for u in services]
    return [*restored, *started, Remove(CORDON_FILE)]


def ledger_op(content: bytes) -> FileWrite:
    return FileWrite(LEDGER_FILE, content, 0o644)
