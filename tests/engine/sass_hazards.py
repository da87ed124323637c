"""Reads a Hopper kernel's SASS for the one hazard ptxas may leave in a kernel whose warpgroup MMA takes its first
operand from registers: an instruction writing one of those registers while an MMA that reads them is still in
flight (issued, and not yet retired by a `WARPGROUP.DEPBAR.LE gsb0, N` that leaves fewer than it pending). The
hardware reads that operand while the MMA runs, so such a write changes what it multiplies.

A loop's body is walked twice, so what one iteration leaves in flight meets the next iteration's writes; a loop
inside another twice each time the outer body is walked."""

from __future__ import annotations

import re
from dataclasses import dataclass

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)\s*([^;]*);")
# opcodes whose first operand is not a register they write
_NO_DESTINATION = ("ST", "LDGSTS", "RED", "ATOM", "BAR", "BRA", "DEPBAR", "WARPGROUP", "LDGDEPBAR", "EXIT", "FENCE",
                   "MEMBAR", "ISETP", "FSETP", "HSETP", "PLOP3", "NOP", "RET", "CALL", "SYNCS", "WARPSYNC", "BSYNC",
                   "BSSY", "YIELD", "CCTL", "HGMMA")


@dataclass(frozen=True)
class Hazard:
    address: int
    opcode: str
    registers: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.address:#06x} {self.opcode} writes R{', R'.join(map(str, self.registers))} under an MMA"


def operand_hazards(sass: str) -> list[Hazard]:
    """Every write to a register an in-flight warpgroup MMA reads its first operand from."""
    instructions = [(int(a, 16), op, [o.strip() for o in ops.split(",")] if ops.strip() else [])
                    for a, op, ops in _INSTRUCTION.findall(sass)]
    order = _walk(_loops(instructions), 0, len(instructions) - 1)
    pending: list[set[int]] = []
    group: set[int] = set()
    found = []
    for i in order:
        address, opcode, operands = instructions[i]
        if opcode.startswith("HGMMA"):
            group |= _operand_registers(operands)
            if "gsb0" in operands:  # the last MMA of a committed group
                pending.append(group)
                group = set()
        elif opcode == "WARPGROUP.DEPBAR.LE":
            keep = int(operands[1], 16)
            pending = pending[len(pending) - keep:] if keep else []
        hit = _written(opcode, operands) & set().union(*pending)
        if hit:
            found.append(Hazard(address, opcode, tuple(sorted(hit))))
    return found


def _walk(loops: list[tuple[int, int]], first: int, last: int) -> list[int]:
    """Instruction indices first..last in the order checked: each loop's body twice, a loop inside a loop twice
    each time its outer loop's body is walked."""
    order, i = [], first
    while i <= last:
        inner = [(s, e) for s, e in loops if s == i and e <= last and (s, e) != (first, last)]
        if inner:
            start, end = max(inner, key=lambda loop: loop[1])
            body = _walk(loops, start, end)
            order += body + body
            i = end + 1
        else:
            order.append(i)
            i += 1
    return order


def _loops(instructions) -> list[tuple[int, int]]:
    """(first, last) instruction index of each backward branch's loop."""
    index = {address: i for i, (address, _, _) in enumerate(instructions)}
    loops = []
    for i, (address, opcode, operands) in enumerate(instructions):
        if opcode == "BRA" and operands and operands[0].startswith("0x") and int(operands[0], 16) < address:
            loops.append((index[int(operands[0], 16)], i))
    return loops


def _operand_registers(operands) -> set[int]:
    m = re.fullmatch(r"R(\d+)", operands[1])  # a register first operand: four registers of bf16 / fp16 pairs
    return set(range(int(m.group(1)), int(m.group(1)) + 4)) if m else set()


def _written(opcode: str, operands) -> set[int]:
    if not operands or opcode.startswith(_NO_DESTINATION):
        return set()
    m = re.fullmatch(r"R(\d+)(\.\w+)?", operands[0])
    if not m:
        return set()
    width = 4 if ".128" in opcode else 2 if ".64" in opcode or ".WIDE" in opcode else 1
    return set(range(int(m.group(1)), int(m.group(1)) + width))


def mma_loop_spills(sass: str) -> int:
    """Local-memory loads and stores (spills) inside an innermost loop that issues warpgroup MMAs: the K loop,
    where a spill costs every tile (one in a prologue or epilogue costs once per output tile)."""
    instructions = [(int(a, 16), op, [o.strip() for o in ops.split(",")] if ops.strip() else [])
                    for a, op, ops in _INSTRUCTION.findall(sass)]
    loops = _loops(instructions)
    innermost = [(s, e) for s, e in loops if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in loops)]
    body = [instructions[s:e + 1] for s, e in innermost]
    return sum(op.startswith(("LDL", "STL")) for ops in body if any(o.startswith("HGMMA") for _, o, _ in ops)
               for _, op, _ in ops)
