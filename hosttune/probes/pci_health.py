"""Parser for the PCI health section: AER counters, IOMMU group types, ACS on GPU paths."""

from __future__ import annotations

from hosttune.probes.facts_health import AerCounts, BridgeAcs
from hosttune.probes.sections import keyed

_AER_FILES = {"aer_dev_correctable": "correctable", "aer_dev_nonfatal": "nonfatal", "aer_dev_fatal": "fatal"}


def _aer(kinds: dict[str, str], lines: list[tuple[str, str, str, int]]) -> tuple[AerCounts, ...]:
    """Totals per device and severity; the TOTAL_ERR_* line when the kernel prints one."""
    totals: dict[str, dict[str, int]] = {b: {} for b in kinds}
    nonzero: dict[str, list[tuple[str, int]]] = {b: [] for b in kinds}
    for bdf, severity, counter, value in lines:
        if counter.startswith("TOTAL_ERR"):
            totals[bdf][severity] = value
            continue
        totals[bdf][severity + "+"] = totals[bdf].get(severity + "+", 0) + value
        if value:
            nonzero[bdf].append((f"{severity} {counter}", value))
    out = []
    for bdf, kind in kinds.items():
        t = totals[bdf]
        if not t:
            continue  # no AER counters in sysfs for this function
        count = {s: t.get(s, t.get(s + "+", 0)) for s in _AER_FILES.values()}
        out.append(AerCounts(bdf, kind, nonzero=tuple(nonzero[bdf]), **count))
    return tuple(out)


def parse_pci_health(text: str) -> tuple[tuple[AerCounts, ...], dict[str, str], tuple[BridgeAcs, ...], int]:
    """`dev:BDF:KIND`, `aer:BDF:FILE:COUNTER VALUE`, `iommu:BDF:TYPE`, `acs:BRIDGE:GPU:CTL`."""
    kinds: dict[str, str] = {}
    aer, iommu, bridges = [], {}, []
    for key, value in keyed(text):
        if key == "dev":
            bdf, _, kind = value.rpartition(":")
            kinds[bdf] = kind
        elif key == "aer":
            bdf, file, line = value[:12], *value[13:].split(":", 1)
            counter, _, count = line.strip().rpartition(" ")
            if file in _AER_FILES and count.isdigit() and bdf in kinds:
                aer.append((bdf, _AER_FILES[file], counter.strip(), int(count)))
        elif key == "iommu":
            iommu[value[:12]] = value[13:]
        elif key == "acs":
            bridge, gpu, ctl = value[:12], value[13:25], value[26:]
            bridges.append(BridgeAcs(bridge, gpu, int(ctl) if ctl.isdigit() else None, ctl != "unreadable"))
    switches = sum(1 for kind in kinds.values() if kind == "nvswitch")
    return _aer(kinds, aer), iommu, tuple(bridges), switches
