"""Rollback and the boot units an apply enabled: one that ran since is stopped (and said so); one that
never ran is neither stopped nor announced, in the plan that rollback shows first or in its recap."""

from __future__ import annotations

from hosttune.config.inventory import local_inventory
from hosttune.execute.journal import Journal, JournalStep, OpRecord
from hosttune.execute.rollback import rollback_journal, undo_list
from hosttune.transport.base import CommandResult, Transport

HOST = local_inventory().hosts[0]
UNIT = "hosttune-thp.service"


class Host(Transport):
    """Answers `systemctl is-active` as the unit is; records every command that would change the host."""

    def __init__(self, active: bool):
        self.host_name, self.active, self.changes = "h", active, []

    def _command(self, argv, stdin, timeout):
        argv = tuple(argv)
        if argv[:2] == ("systemctl", "is-active"):
            return CommandResult(argv, 0 if self.active else 3, "", "", 0.0)
        self.changes.append(argv)
        return CommandResult(argv, 0, "", "", 0.0)

    def change(self, argv, *, stdin=None, timeout=None):
        return self._command(argv, stdin, timeout)


def journal() -> Journal:
    enable = OpRecord("service", f"enable {UNIT}", unit=UNIT, enabled=True, before_enabled="disabled",
                      before_active="inactive", status="done")
    return Journal("r1", "h", "/", "now", (JournalStep(0, ("memory.thp",), "thp", False, False, (enable,), "done"),))


def test_a_boot_unit_that_never_ran_is_not_stopped_nor_announced():
    assert [u.if_active for u in undo_list(journal())] == [UNIT, None]
    host = Host(active=False)
    result = rollback_journal(host, HOST, journal(), None)
    assert result.done == (f"disable {UNIT} again",) and not any(a[:2] == ("systemctl", "stop") for a in host.changes)


def test_a_boot_unit_that_ran_since_is_stopped():
    host = Host(active=True)
    result = rollback_journal(host, HOST, journal(), None)
    assert result.done == (f"stop {UNIT} (it started since the apply)", f"disable {UNIT} again")
    assert ("systemctl", "stop", UNIT) in host.changes
