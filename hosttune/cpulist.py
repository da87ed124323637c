"""Linux CPU lists ("0-3,8,10-11"), as the kernel prints them in sysfs and /proc."""

from __future__ import annotations

MAX_CPUS = 8192  # Linux's largest NR_CPUS (x86 MAXSMP); a list past it is a typo, not a host


def parse(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist; raises ValueError on anything else (or on CPUs past MAX_CPUS)."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        part = part.strip()
        if not part:  # "0-3," from a list built in a shell: a CPU left out, not one fewer to use
            raise ValueError(f"CPU list {text!r} has an empty entry; list CPUs such as 0-3,8")
        lo, sep, hi = part.partition("-")
        if not _number(lo) or (sep and not _number(hi)):
            raise ValueError(f"not a CPU list: {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last >= MAX_CPUS:
            raise ValueError(f"CPU {last} in {part!r} is past the largest CPU number Linux supports ({MAX_CPUS - 1})")
        if last < first:
            raise ValueError(f"descending range {part!r} in CPU list {text!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format(cpus: tuple[int, ...] | list[int] | set[int]) -> str:  # noqa: A001 - mirrors parse
    """The shortest kernel-style cpulist for a set of CPUs."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = None
    for cpu in ordered + [None]:
        if start is not None and (cpu is None or cpu != prev + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 6
