# Runs ON THE HOST beside prefix_router.py (standard library only), and in hosttune's tests.
"""Where the prefix router sends a request: pure placement over the replicas, no I/O.

A request's key is a hash of the first characters of its prompt text. The table remembers which
replica each key went to (the replica whose prefix cache holds it) and sends the key there again.
A new key goes to the replica that holds the fewest keys, so the prompts a host serves spread over
its replicas and each replica's cache keeps its share; ties go to the fewest requests in flight,
then round a rotating order (never always the first). A replica far busier than the others lets one
request of its key spill to the least loaded without giving up the key. A replica that leaves gives
up its keys: each goes to a replica with room the next time it comes.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, OrderedDict
from dataclasses import dataclass
from enum import Enum

DEFAULT_PREFIX_CHARS = 256
DEFAULT_MAX_KEYS = 65536


class Why(Enum):
    """Why a request went where it went."""

    KEPT = "kept"  # its key's replica
    NEW = "new"  # a key not seen before (or whose replica left): the replica with the fewest keys
    SPILL = "spill"  # its key's replica is overloaded: this request only, to the least loaded
    NO_KEY = "no_key"  # no prompt to key on: the least loaded


@dataclass(frozen=True)
class Decision:
    worker: str
    why: Why


class NoWorker(Exception):
    """No replica is in rotation."""


def prompt_text(doc: object) -> str | None:
    """The prompt of a completions (`prompt`) or chat (`messages`' contents, in order) request, else None."""
    if not isinstance(doc, dict):
        return None
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:  # several prompts (the first), or one or several of token ids
        first = prompt[0]
        return first if isinstance(first, str) else json.dumps(first if isinstance(first, list) else prompt)
    messages = doc.get("messages")
    if isinstance(messages, list) and messages:
        return "\n".join(_content(m) for m in messages)
    return None


def _content(message: object) -> str:
    """A chat message's text: a string, or its text parts joined."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def prefix_key(body: bytes, chars: int = DEFAULT_PREFIX_CHARS) -> str | None:
    """The placement key of a request body: a hash of its prompt's first `chars` characters; None when
    the body is no JSON request with a prompt."""
    try:
        text = prompt_text(json.loads(body)) if body else None
    except (ValueError, UnicodeDecodeError):
        return None
    if not text:
        return None
    return hashlib.blake2b(text[:chars].encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def spill_bound(mean_in_flight: float) -> float:
    """A key's replica holding more requests in flight than this sends the next one elsewhere."""
    return max(2 * mean_in_flight, mean_in_flight + 4)


class PrefixTable:
    """Keys to replicas (least recently used dropped past max_keys), and each replica's requests in flight."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS, by_prefix: bool = True):
        self.max_keys = max_keys
        self.by_prefix = by_prefix  # False: every request to the least loaded (a baseline to compare with)
        self.workers: list[str] = []  # in the order they were added
        self.down: set[str] = set()  # failing their health check: out of rotation, still listed
        self.keys: OrderedDict[str, str] = OrderedDict()
        self.num_keys: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.turn = 0

    # -- the replicas
    def add(self, worker: str) -> bool:
        self.down.discard(worker)
        if worker in self.workers:
            return False
        self.workers.append(worker)
        return True

    def remove(self, worker: str) -> bool:
        """Out of the table with its keys: a replica that comes back starts with an empty cache."""
        if worker not in self.workers:
            return False
        self.workers.remove(worker)
        self.down.discard(worker)
        for key in [k for k, w in self.keys.items() if w == worker]:
            del self.keys[key]
        del self.num_keys[worker]
        return True

    def set_up(self, worker: str, is_up: bool) -> None:
        """Its health check's verdict: a replica that is down keeps its keys and gets no request."""
        if worker in self.workers:
            (self.down.discard if is_up else self.down.add)(worker)

    def live(self) -> list[str]:
        return [w for w in self.workers if w not in self.down]

    # -- a request's life
    def choose(self, key: str | None, exclude: frozenset[str] = frozenset()) -> Decision:
        """The replica for a request with this key (None: no key); `exclude`: replicas that just failed it."""
        live = [w for w in self.live() if w not in exclude]
        if not live:
            raise NoWorker("no replica in rotation")
        if key is None or not self.by_prefix:
            return Decision(self._least_loaded(live), Why.NO_KEY)
        owner = self.keys.get(key)
        if owner in live:
            self.keys.move_to_end(key)
            if self.in_flight[owner] > spill_bound(self._mean_in_flight(live)):
                return Decision(self._least_loaded(live), Why.SPILL)
            return Decision(owner, Why.KEPT)
        return Decision(self._assign(key, live), Why.NEW)

    def start(self, worker: str) -> None:
        self.in_flight[worker] += 1

    def finish(self, worker: str) -> None:
        self.in_flight[worker] -= 1

    # -- placement
    def _assign(self, key: str, live: list[str]) -> str:
        """The key to the replica with the fewest keys; ties: fewest in flight, then the rotating order."""
        worker = min(self._rotated(live), key=lambda w: (self.num_keys[w], self.in_flight[w]))
        previous = self.keys.pop(key, None)
        if previous is not None:
            self.num_keys[previous] -= 1
        self.keys[key] = worker
        self.num_keys[worker] += 1
        while len(self.keys) > self.max_keys:
            _, evicted = self.keys.popitem(last=False)
            self.num_keys[evicted] -= 1
        return worker

    def _least_loaded(self, live: list[str]) -> str:
        return min(self._rotated(live), key=lambda w: self.in_flight[w])

    def _mean_in_flight(self, live: list[str]) -> float:
        return sum(self.in_flight[w] for w in live) / len(live)

    def _rotated(self, live: list[str]) -> list[str]:
        """The replicas starting one further on each decision: ties do not all go to the first."""
        start = self.turn % len(live)
        self.turn += 1
        return live[start:] + live[:start]

    def keys_per_worker(self) -> dict[str, int]:
        return {w: self.num_keys[w] for w in self.workers}
