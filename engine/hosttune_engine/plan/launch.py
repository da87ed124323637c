"""A kernel's launch config as one typed value: block shapes, warps, stages and the variant switches the
tuner measured (read from and written to the tuned tables' JSON, whose keys the kernels take)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum

from hosttune_engine.errors import ConfigError


class Fp8Method(Enum):
    """The batched path of an FP8 layer with FP8 activations."""

    UNIT = "unit"  # torch._scaled_mm with unit scales and our scale epilogue
    ROWWISE = "rowwise"  # scales in cuBLAS's epilogue
    TRITON = "triton"  # our FP8 GEMM, scales in its epilogue
    W8A16 = "w8a16"  # our GEMM, activations kept in bf16


@dataclass(frozen=True)
class LaunchConfig:
    """None leaves a switch at the kernel's own default."""

    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    group_m: int | None = None
    split_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    fuse: bool | None = None  # a GEMV's RMSNorm / SwiGLU prologue fused (False: run by its own kernels first)
    dequant: bool | None = None  # W4A16 through a dequantized weight and cuBLAS
    nibbles: bool | None = None  # the W4A16 GEMM one dot per nibble position
    swap: bool | None = None  # False: x first in the nibble GEMM's MMA
    wgmma: bool | None = None  # the W4A16 GEMM on Hopper's warpgroup MMA (kernels/w4a16_hopper.py)
    regs: bool | None = None  # that GEMM's unpacked weights the MMA's register operand (no shared-memory tile)
    overlap: bool | None = None  # that GEMM's next K tile started under the last tile's MMA (REGS)
    packed: bool | None = None  # a quantized GEMV's fp16x2 products
    xb: bool | None = None  # the FP8 GEMV's activations in the weight tile's layout
    dot: bool | None = None  # the FP8 GEMV on the tensor cores
    swiglu: bool | None = None  # the FP8 gate_up GEMM may compute down_proj's SwiGLU in its epilogue
    fast_acc: bool | None = None  # the FP8 GEMM's fast accumulation
    bits: bool | None = None  # FP8 weights read as bytes, e4m3 decoded by integer operations (before 8.9)
    unroll: int | None = None  # a GEMV's K loop unrolled this many times
    pipe: int | None = None  # a GEMV's K loop software-pipelined
    split: int | None = None  # a GEMV's K split across this many programs a row block
    method: Fp8Method | None = None  # an FP8 layer's batched path

    @classmethod
    def from_table(cls, entry: dict, where: str = "tuned table") -> "LaunchConfig":
        """A table entry ({"BLOCK_N": 8, "FUSE": 0, ...}) -> its config; an unknown key is an error."""
        values = {}
        for key, value in entry.items():
            name = key.lower()
            if name not in _TYPES:
                raise ConfigError(f"{where}: unknown launch-config key {key!r}; known: {', '.join(_KEYS)}")
            values[name] = _TYPES[name](key, value, where)
        return cls(**values)

    def merged(self, over: "LaunchConfig") -> "LaunchConfig":
        """This config with every switch `over` sets."""
        return LaunchConfig(**{**self._set(), **over._set()})

    def _set(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def kernel_args(self) -> dict:
        """The dict the kernels take: table keys, switches as 0/1."""
        out = {}
        for name, value in self._set().items():
            out[_key(name)] = value.value if isinstance(value, Enum) else (int(value) if isinstance(value, bool)
                                                                          else value)
        return out

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.kernel_args().items()) or "-"


def _key(name: str) -> str:
    return name if name.startswith("num_") else name.upper()


# Each value of a table entry, checked as it is read: a hand-edited table is refused in one line, not at launch.
def _flag(key: str, value, where: str) -> bool:
    if value not in (0, 1):  # JSON true and false are 1 and 0 here
        raise ConfigError(f"{where}: {key} {value!r}: give 0 or 1")
    return bool(value)


def _whole(key: str, value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {key} {value!r}: give a whole number >= 1")
    return value


def _method(key: str, value, where: str) -> Fp8Method:
    try:
        return Fp8Method(value)
    except ValueError:
        raise ConfigError(f"{where}: {key} {value!r}: give one of {', '.join(m.value for m in Fp8Method)}") from None


_TYPES = {f.name: (_method if f.name == "method" else _flag if "bool" in str(f.type) else _whole)
          for f in fields(LaunchConfig)}
_KEYS = tuple(_key(n) for n in _TYPES)
