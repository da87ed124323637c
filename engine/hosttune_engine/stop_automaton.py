"""An Aho-Corasick automaton over a request's stop strings: each new character of the output costs O(1) moves
(amortized), whatever the number and lengths of the strings (torch-free).

States are the strings' distinct prefixes, the empty one (state 0) first. A state's fail link is the state of
its longest proper suffix that is also a prefix; following one only shortens the match so far, so a text of n
characters takes at most 2n moves in all. A state knows the longest stop string that its prefix ends with, so
the earliest start among the matches that end at a character is one lookup.

The trie is compact, as a request may bring hundreds of thousands of strings: states are numbered as they are
added, so the new tail of a string is a run of consecutive states, and the child numbered next is one code
point in an array; only states where strings part keep a dict, of their other children.
"""

from __future__ import annotations

from array import array
from collections import deque

NO_CHILD = -1  # in `_next_code`: the state numbered next is not a child of this one


class StopAutomaton:
    """The automaton of `strings` (empty ones match nothing), or, past `max_states` states, not (`is_complete`
    False).
    `scan` runs it over new text from the state that the text before it left."""

    def __init__(self, strings, max_states: int):
        self._next_code = array("i", [NO_CHILD])  # [state] code point of the child numbered state + 1
        self._branches: dict[int, dict[int, int]] = {}  # state -> {code point: child} of its other children
        self._depth = array("i", [0])  # [state] length of its prefix
        self._longest = array("i", [0])  # [state] length of the longest stop string its prefix ends with, or 0
        self.max_len = max(map(len, strings), default=0)
        self.is_complete = self._add_all(sorted(set(strings) - {""}), max_states)
        self._fail = array("i", [0]) * len(self._depth)  # [state] its fail link
        if self.is_complete:
            self._link()

    @property
    def num_states(self) -> int:
        return len(self._depth)

    # -- building ---------------------------------------------------------------------------
    def _add_all(self, strings: list[str], max_states: int) -> bool:
        """Add sorted, distinct strings: each shares with the trie what it shares with the one before it, so
        finding that takes a few comparisons of slices, not a move a character. False past `max_states`."""
        before, path = "", array("i", [0])  # path: [depth] the state of `before`'s prefix of that length
        for string in strings:
            common = _common_prefix_len(before, string)  # < len(string): a prefix sorts before what it begins
            if len(self._depth) + len(string) - common > max_states:
                return False
            first = self._add_tail(path[common], string[common:])
            del path[common + 1 :]
            path.extend(range(first, first + len(string) - common))
            self._longest[path[-1]] = len(string)
            before = string
        return True

    def _add_tail(self, parent: int, tail: str) -> int:
        """States for `tail` below `parent`, numbered on from the last; the first of them."""
        first = len(self._depth)
        if parent == first - 1:  # nothing is numbered after it yet: its next is free
            self._next_code[parent] = ord(tail[0])
        else:
            self._branches.setdefault(parent, {})[ord(tail[0])] = first
        self._next_code.extend(map(ord, tail[1:]))
        self._next_code.append(NO_CHILD)
        depth = self._depth[parent]
        self._depth.extend(range(depth + 1, depth + len(tail) + 1))
        self._longest.extend(array("i", [0]) * len(tail))
        return first

    def _link(self) -> None:
        """Fail links breadth first, so that a state's link (a shorter prefix) is set before its children's."""
        next_code, branches, fail, longest = self._next_code, self._branches, self._fail, self._longest
        queue = deque([1] if next_code[0] != NO_CHILD else [])  # the root's children: linked to it
        queue.extend(branches.get(0, {}).values())
        while queue:
            state = queue.popleft()
            children = [(next_code[state], state + 1)] if next_code[state] != NO_CHILD else []
            children.extend(branches.get(state, {}).items())
            for code, child in children:
                fail[child] = link = self._goto(fail[state], code)
                if not longest[child]:
                    longest[child] = longest[link]
                queue.append(child)

    # -- running ----------------------------------------------------------------------------
    def _child(self, state: int, code: int) -> int | None:
        if self._next_code[state] == code:
            return state + 1
        branches = self._branches.get(state)
        return None if branches is None else branches.get(code)

    def _goto(self, state: int, code: int) -> int:
        while (child := self._child(state, code)) is None and state:
            state = self._fail[state]
        return 0 if child is None else child

    def held(self, state: int) -> int:
        """How many of the last characters of the text so far could still begin a stop string."""
        return self._depth[state]

    def scan(self, state: int, text: str, start: int) -> tuple[int, int, int]:
        """Run over text[start:] from `state` (that of text[:start]): (the new state, the start and length in
        `text` of the match that starts first among those that end after `start`, of two starting together the
        shorter; (state, -1, 0) if none). After a match the state is of no further use."""
        best_start, best_len = -1, 0
        for end, code in enumerate(map(ord, text[start:]), start + 1):
            if best_len and end - self.max_len >= best_start:  # no match ending here starts before the best
                break
            state = self._goto(state, code)
            if (n := self._longest[state]) and (not best_len or end - n < best_start):
                best_start, best_len = end - n, n
        return state, best_start, best_len


def _common_prefix_len(a: str, b: str) -> int:
    """Bisected on slices, whose comparison runs in C."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
