"""Length distributions for prompts and outputs, parsed from short spec strings.

Spec syntax (tokens):

    512                       fixed length (also `fixed:512`)
    uniform:32-6800           uniform integer in [32, 6800]
    normal:4200,1200          normal, mean 4200, sigma 1200, clipped to [1, 2*mean]
    normal:4200,1200,300-6800 normal clipped to [300, 6800]
    mix:0.3*uniform:32-512+0.7*normal:4200,1200,300-6800
                              a weighted mixture of the above
    chat-docs                 a production mix of chat and documents: 30% short chat turns
                              (uniform 32-512) and 70% documents (normal 4200, sigma
                              1200, clipped to 300-6800)
    jsonl:PATH[:FIELD]        lengths replayed in file order from a JSONL file; FIELD
                              defaults to `prompt_tokens` (outputs: `output_tokens`)

`sample(rng, index)` gives the length of the index-th request, drawing from a
`random.Random` the caller owns, so a run is reproducible from its seed.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hosttune.bench.input_file import read_input
from hosttune.errors import BenchError

CHAT_DOCS = "mix:0.3*uniform:32-512+0.7*normal:4200,1200,300-6800"
MAX_LENGTH = 10_000_000  # tokens: past any model's context, and a prompt bench could still build in memory


class LengthDistribution(Protocol):
    def sample(self, rng: random.Random, index: int) -> int: ...

    def describe(self) -> str: ...

    @property
    def high(self) -> int:
        """The longest length it can give."""
        ...


@dataclass(frozen=True)
class Fixed:
    length: int

    def sample(self, rng: random.Random, index: int) -> int:
        return self.length

    def describe(self) -> str:
        return f"fixed {self.length}"

    @property
    def high(self) -> int:
        return self.length


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int

    def sample(self, rng: random.Random, index: int) -> int:
        return rng.randint(self.low, self.high)

    def describe(self) -> str:
        return f"uniform {self.low}-{self.high}"


@dataclass(frozen=True)
class Normal:
    mean: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: random.Random, index: int) -> int:
        return min(self.high, max(self.low, round(rng.gauss(self.mean, self.sigma))))

    def describe(self) -> str:
        return f"normal mean {self.mean:g} sigma {self.sigma:g} in {self.low}-{self.high}"


@dataclass(frozen=True)
class Mixture:
    weights: tuple[float, ...]
    parts: tuple[LengthDistribution, ...]

    def sample(self, rng: random.Random, index: int) -> int:
        part = rng.choices(self.parts, weights=self.weights)[0]
        return part.sample(rng, index)

    def describe(self) -> str:
        total = sum(self.weights)
        return " + ".join(
            f"{w / total:.0%} {p.describe()}" for w, p in zip(self.weights, self.parts)
        )

    @property
    def high(self) -> int:
        return max(part.high for part in self.parts)


@dataclass(frozen=True)
class Replay:
    """Lengths from a file, replayed in order (and again from the top)."""

    lengths: tuple[int, ...]
    source: str

    def sample(self, rng: random.Random, index: int) -> int:
        # Replay order is the file's; the rng is unused on purpose.
        return self.lengths[index % len(self.lengths)]

    def describe(self) -> str:
        return f"{len(self.lengths)} lengths from {self.source}"

    @property
    def high(self) -> int:
        return max(self.lengths)


def parse_distribution(spec: str, *, jsonl_field: str = "prompt_tokens") -> LengthDistribution:
    """Parse a spec string (see the module docstring) into a distribution."""
    spec = spec.strip()
    if spec == "chat-docs":
        spec = CHAT_DOCS
    kind, _, arg = spec.partition(":")
    if not arg and _is_int(kind):
        return Fixed(_positive(kind, spec))
    parsers = {
        "fixed": lambda a: Fixed(_positive(a, spec)),
        "uniform": lambda a: _uniform(a, spec),
        "normal": lambda a: _normal(a, spec),
        "mix": lambda a: _mixture(a, jsonl_field),
        "jsonl": lambda a: _replay(a, jsonl_field),
    }
    if kind not in parsers or not arg:
        raise BenchError(
            f"unknown length distribution {spec!r}: use N, uniform:A-B, normal:MEAN,SIGMA"
            "[,MIN-MAX], mix:W*DIST+W*DIST, chat-docs or jsonl:PATH[:FIELD]"
        )
    return parsers[kind](arg)


def _is_int(text: str) -> bool:
    return text.strip().isdigit()


def _positive(text: str, spec: str) -> int:
    if not _is_int(text) or int(text) < 1:
        raise BenchError(f"length distribution {spec!r}: {text!r} is not a positive integer")
    if int(text) > MAX_LENGTH:
        raise BenchError(f"length distribution {spec!r}: {text.strip()} tokens is past the {MAX_LENGTH} bench builds "
                         "(no model reads more)")
    return int(text)


def _range(text: str, spec: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep:
        raise BenchError(f"length distribution {spec!r}: expected a range like 32-6800")
    low_i, high_i = _positive(low, spec), _positive(high, spec)
    if low_i > high_i:
        raise BenchError(f"length distribution {spec!r}: range {text} is empty")
    return low_i, high_i


def _uniform(arg: str, spec: str) -> Uniform:
    return Uniform(*_range(arg, spec))


def _normal(arg: str, spec: str) -> Normal:
    fields = arg.split(",")
    if len(fields) not in (2, 3):
        raise BenchError(f"length distribution {spec!r}: use normal:MEAN,SIGMA[,MIN-MAX]")
    try:
        mean, sigma = float(fields[0]), float(fields[1])
    except ValueError:
        raise BenchError(f"length distribution {spec!r}: mean and sigma must be numbers") from None
    if not (1 <= mean <= MAX_LENGTH and 0 <= sigma <= MAX_LENGTH):  # also NaN and infinity
        raise BenchError(f"length distribution {spec!r}: need 1 <= mean <= {MAX_LENGTH} and 0 <= sigma <= {MAX_LENGTH}")
    low, high = _range(fields[2], spec) if len(fields) == 3 else (1, max(1, round(2 * mean)))
    return Normal(mean, sigma, low, high)


def _mixture(arg: str, jsonl_field: str) -> Mixture:
    weights, parts = [], []
    for term in arg.split("+"):
        weight, star, dist = term.partition("*")
        try:
            w = float(weight)
        except ValueError:
            w = -1.0
        if not star or not 0 < w < math.inf:  # NaN compares False
            raise BenchError(f"mixture term {term!r}: write it as WEIGHT*DIST, e.g. 0.3*uniform:32-512")
        weights.append(w)
        parts.append(parse_distribution(dist, jsonl_field=jsonl_field))
    return Mixture(tuple(weights), tuple(parts))


def _replay(arg: str, default_field: str) -> Replay:
    path_text, _, field = arg.partition(":")
    field = field or default_field
    path = Path(path_text)
    lengths = []
    for number, line in enumerate(read_input(path, "length file").splitlines(), start=1):
        if line.strip():
            lengths.append(_length_from_line(line, field, path, number))
    if not lengths:
        raise BenchError(f"length file {path} has no lines")
    return Replay(tuple(lengths), str(path))


def _length_from_line(line: str, field: str, path: Path, number: int) -> int:
    try:
        value = json.loads(line)[field]
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"{path}:{number}: expected a JSON object with an integer {field!r}") from None
    if not isinstance(value, int) or not 1 <= value <= MAX_LENGTH:
        raise BenchError(f"{path}:{number}: {field!r} must be an integer from 1 to {MAX_LENGTH}, got {value!r}")
    return value
