"""Parser for the kernel log's NVIDIA Xid lines (dmesg or this boot's kernel journal)."""

from __future__ import annotations

import re

from hosttune.probes.facts_health import KernelLog, XidEvent
from hosttune.probes.sections import keyed

# "[ 1234.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
# Older drivers print the address without "PCI:".
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (\d+),\s*(.*)$")


def parse_xid_line(line: str) -> XidEvent | None:
    m = _XID.search(line)
    return XidEvent(m[1].lower(), int(m[2]), m[3].strip()) if m else None


def parse_kernel_log(text: str, rc: int) -> KernelLog:
    """The kernel-log section: 'source:', 'total:' and the last Xid lines as 'xid:'."""
    if rc != 0:
        return KernelLog()
    source, total, events = None, 0, []
    for key, value in keyed(text):
        if key == "source":
            source = value
        elif key == "total":
            total = int(value.strip() or 0)
        elif key == "xid" and (event := parse_xid_line(value)):
            events.append(event)
    return KernelLog(source, tuple(events), max(total, len(events)))
