"""A package's layers, held by reading every import with ast.

Every package and top-level module of a package (a *unit*; the package's own `__init__` is the unit
`__init__`) has a place in an ordered list of layers. A module may import its own unit and the layers below
it, never a layer above, and the units of one layer are independent of each other.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layering:
    package: Path  # the package's folder, e.g. .../hosttune
    layers: tuple[tuple[str, ...], ...]  # bottom first

    @property
    def name(self) -> str:
        return self.package.name

    @property
    def units(self) -> dict[str, int]:
        return {unit: number for number, layer in enumerate(self.layers) for unit in layer}

    def at(self, package: Path) -> Layering:
        """The same layers over another copy of the package (a planted one, in a test of the checker)."""
        return Layering(package, self.layers)

    def modules(self) -> list[Path]:
        return sorted(self.package.rglob("*.py"))

    def module_name(self, path: Path) -> str:
        parts = path.relative_to(self.package.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def imports(self, path: Path) -> set[str]:
        """The modules a file imports, relative imports resolved; `from pkg import sub` counts as `pkg.sub`."""
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = self._absolute(path, node)
                names.add(module)
                names.update(f"{module}.{a.name}" for a in node.names if self._is_submodule(module, a.name))
        return names

    def _absolute(self, path: Path, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module
        here = self.module_name(path).split(".")
        base = here if path.name == "__init__.py" else here[:-1]
        base = base[:len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def _is_submodule(self, module: str, name: str) -> bool:
        parts = module.split(".")
        if parts[0] != self.name:
            return False
        if len(parts) == 1 and name in self.units:
            return True
        folder = self.package.joinpath(*parts[1:])
        return (folder / name).is_dir() or (folder / f"{name}.py").is_file()

    def unit_of(self, module: str) -> str | None:
        """`pkg.checks.cpu` -> `checks`; `pkg` -> `__init__`; None outside the package."""
        parts = module.split(".")
        if parts[0] != self.name:
            return None
        return parts[1] if len(parts) > 1 else "__init__"

    def package_units(self) -> set[str]:
        return {self.unit_of(self.module_name(path)) for path in self.modules()}

    def unplaced(self) -> str:
        """What has no layer, or a layer but no code; empty when the two agree."""
        found, placed = self.package_units(), set(self.units)
        if found == placed:
            return ""
        return f"without a layer: {sorted(found - placed)}; not in {self.name}/: {sorted(placed - found)}"

    def faults(self, path: Path) -> list[str]:
        """Each import of `path` that reaches a unit without a layer, beside its own or above it."""
        units, own = self.units, self.unit_of(self.module_name(path))
        name, faults = path.relative_to(self.package.parent).as_posix(), []
        if own not in units:
            return [f"{name} is in {own}, which has no layer"]
        for module in sorted(self.imports(path)):
            other = self.unit_of(module)
            if other is None or other == own:
                continue
            if other not in units:
                faults.append(f"{name} imports {module}, which has no layer")
            elif units[other] >= units[own]:
                where = "beside it" if units[other] == units[own] else "above it"
                faults.append(f"{name} ({own}) imports {module} ({other}, a layer {where})")
        return faults

    def all_faults(self) -> list[str]:
        return [fault for path in self.modules() for fault in self.faults(path)]
