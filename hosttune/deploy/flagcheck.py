"""Every flag a unit would pass, checked against the installed release's own `serve --help` before
the unit starts: a flag the release does not know (renamed, removed, a typo) is refused in one line
instead of a service that exits at start and a gate that times out.

When the host already has a release with the same wheels, the check runs there before anything
changes; otherwise on the new release right after its install, before anything live changes.
"""

from __future__ import annotations

import json

from hosttune.deploy.errors import DeployError
from hosttune.deploy.plan import placeholder_values, serve_flags, wheel_set
from hosttune.deploy.settings import flag_argv
from hosttune.deploy.state import HostState
from hosttune.presets import substitute
from hosttune.transport.base import Transport

HELP_TIMEOUT_S = 300.0

# Runs on the host (python3, standard library): the help text, then which flags it does not name.
_CHECK = r"""
import json, re, subprocess, sys
args = json.loads(sys.argv[1])
def text_of(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=args["timeout"])
    return r.returncode, r.stdout + r.stderr
rc, text = text_of(args["help"])
if rc != 0 and args["help"][-1].startswith("--help="):
    rc, text = text_of(args["help"][:-1] + ["--help"])
if rc != 0:
    print("FAILED " + " ".join(args["help"]) + f" exited {rc}: " + " ".join(text.split()[-30:]))
    sys.exit(0)
known = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", text))
print("UNKNOWN " + json.dumps([f for f in args["flags"] if f not in known]))
"""


class UnknownFlag(DeployError):
    """A flag the installed engine release does not have."""


def flag_names(job) -> list[str]:
    """The --flags the job's units pass to the engine."""
    values = placeholder_values(job.preset, job.settings, job.placement, job.release.dir)
    argv = flag_argv(serve_flags(job.preset, job.settings, job.placement), values, job.preset.serve.false_flag)
    return list(dict.fromkeys(word for word in argv if word.startswith("--")))


def check_line(job, venv: str) -> str | None:
    """check_flags as a plan shows it (None: the engine has no --help to check against)."""
    help_argv = [substitute(a, {"venv": venv}) for a in job.preset.serve.help]
    return f"check the engine's flags against `{' '.join(help_argv)}` (before anything live changes)" if help_argv else None


def check_flags(transport: Transport, job, venv: str) -> None:
    """Raises UnknownFlag (one line) when the release in venv does not know a flag of the job."""
    help_argv = [substitute(a, {"venv": venv}) for a in job.preset.serve.help]
    if not help_argv:
        return
    args = {"help": help_argv, "flags": flag_names(job), "timeout": HELP_TIMEOUT_S}
    result = transport.read(["python3", "-c", _CHECK, json.dumps(args)], timeout=HELP_TIMEOUT_S + 30)
    answer = next((line for line in result.stdout.splitlines() if line.startswith(("UNKNOWN ", "FAILED "))), "")
    if not answer:
        raise DeployError(f"{job.host.name}: checking the engine's flags failed: {result.stderr.strip()[-300:]}")
    if answer.startswith("FAILED "):
        raise DeployError(f"{job.host.name}: {answer[7:]}")
    unknown = json.loads(answer[8:])
    if unknown:
        program = help_argv[0].rsplit("/", 1)[-1]
        raise UnknownFlag(f"{job.host.name}: the installed {program} ({job.entry.key.ref}) does not know "
                          f"{', '.join(unknown)} (checked against `{' '.join(help_argv[1:])}`); "
                          f"drop it with --set FLAG=null or deploy a release that has it")


def check_installed_flags(transport: Transport, job, state: HostState) -> None:
    """Before any change: the same wheels are installed on the host already, so their help can judge."""
    wanted = wheel_set(job.release, job.python)
    donor = next((d.rstrip("/") for d, ws in sorted(state.installed.items()) if ws == wanted), None)
    if donor:
        check_flags(transport, job, donor)
