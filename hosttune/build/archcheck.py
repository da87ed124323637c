"""Does every native library in a wheel carry machine code for every requested CUDA arch?

`cuobjdump --list-elf LIB` lists the cubins embedded in a library ("ELF file 1:
x.1.sm_80.cubin"). A library without device code is not a CUDA library and is skipped; a
CUDA library missing an arch fails the build, because on that GPU it would fall back to
JIT-compiling PTX at start-up (minutes), or fail with "no kernel image is available".
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hosttune.build.archs import sm_name
from hosttune.build.errors import ArchCheckError, BuildError

_CUBIN = re.compile(r"\.(sm_\d+[af]?)\.cubin\s*$", re.M)
_ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class LibraryArchs:
    name: str  # path inside the wheel
    sms: tuple[str, ...]  # sm_* with machine code; () for a library without device code


def parse_list_elf(text: str) -> tuple[str, ...]:
    """The distinct sm_* names in `cuobjdump --list-elf` output, sorted."""
    return tuple(sorted(set(_CUBIN.findall(text)), key=lambda s: (len(s), s)))


def list_elf(cuobjdump: str, library: Path) -> tuple[str, ...]:
    proc = subprocess.run([cuobjdump, "--list-elf", str(library)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        if "does not contain device code" in proc.stdout + proc.stderr:
            return ()
        raise BuildError(f"cuobjdump --list-elf {library.name} failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    return parse_list_elf(proc.stdout)


def wheel_libraries(cuobjdump: str, wheel: Path) -> list[LibraryArchs]:
    """Every ELF shared library in the wheel with the machine code it carries."""
    found = []
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="hosttune-archcheck-") as tmp:
        for info in zf.infolist():
            if not re.search(r"\.so(\.\d+)*$", info.filename):
                continue
            with zf.open(info) as member:
                if member.read(4) != _ELF_MAGIC:
                    continue
            path = Path(zf.extract(info, tmp))
            found.append(LibraryArchs(info.filename, list_elf(cuobjdump, path)))
            path.unlink()
    return found


def missing_archs(libraries: list[LibraryArchs], archs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """{library: requested sm_* it lacks} for every library that has device code."""
    wanted = [sm_name(a) for a in archs]
    gaps = {}
    for lib in libraries:
        if not lib.sms:
            continue
        lacking = tuple(sm for sm in wanted if sm not in lib.sms and f"{sm}a" not in lib.sms)
        if lacking:
            gaps[lib.name] = lacking
    return gaps


def check_wheel(cuobjdump: str, wheel: Path, archs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """{library: sm_*} of a native wheel; raises ArchCheckError if an arch is missing or there is no device code."""
    libraries = wheel_libraries(cuobjdump, wheel)
    cuda_libs = [lib for lib in libraries if lib.sms]
    if not cuda_libs:
        raise ArchCheckError(
            f"{wheel.name}: no library in it carries CUDA machine code (checked {len(libraries)} shared "
            f"libraries); the build compiled no kernels; is TORCH_CUDA_ARCH_LIST honoured and nvcc found?")
    gaps = missing_archs(libraries, archs)
    if gaps:
        lines = [f"  {lib}: has {', '.join(next(x.sms for x in cuda_libs if x.name == lib))}; missing {', '.join(sms)}"
                 for lib, sms in sorted(gaps.items())]
        raise ArchCheckError(f"{wheel.name}: machine code missing for requested architectures:\n" + "\n".join(lines))
    return {lib.name: lib.sms for lib in cuda_libs}
