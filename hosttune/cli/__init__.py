"""The `hosttune` command line. Each command module registers itself on `app`."""

try:  # Ctrl-C while the command line loads (a second or so of imports) exits as interrupted, with no traceback
    from hosttune.cli.app import app
    from hosttune.cli import check as _check  # noqa: F401  (registers check, facts, explain)
    from hosttune.cli import apply as _apply  # noqa: F401  (registers apply, rollback, verify)
    from hosttune.cli import bench as _bench  # noqa: F401  (registers bench)
    from hosttune.cli import build as _build  # noqa: F401  (registers build)
    from hosttune.cli import deploy as _deploy  # noqa: F401  (registers deploy)
    from hosttune.cli import remediate as _remediate  # noqa: F401  (registers remediate, uncordon)
    from hosttune.cli import status as _status  # noqa: F401  (registers status, monitor)
except KeyboardInterrupt:
    raise SystemExit(130) from None


def main() -> None:
    app()
