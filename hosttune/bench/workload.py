"""What each request says: its messages and how many tokens it asks for.

- `Synthetic` (the default): one user message of random words, of a sampled length.
- `Dataset`: prompts from a file (see dataset.py), in file order, again from the top.
- `SharedPrefix`: N system prompts, each shared by M users; every request is its user's
  system prompt followed by a new question, so a server with prefix caching computes the
  system prompt once per group.
- `Conversations`: every closed-loop user holds a conversation of `turns` turns; each turn
  sends the whole history (earlier questions and the server's real answers) plus a new
  question, so prompts grow turn by turn; then the user starts a new conversation.

A request's content is a tuple of (role, text) messages. The chat API sends them as they
are; the completions API sends their texts joined by single spaces, so the token count of
word prompts stays the sum of their parts. `num_tokens` is what the prompt was built to:
exact for word prompts with a calibrated tokenizer, an estimate for dataset text and for
histories that hold answers (the server's usage count, when it reports one, is used in
the statistics).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from hosttune.bench.distributions import LengthDistribution
from hosttune.bench.prompts import PromptBuilder
from hosttune.errors import BenchError

Messages = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Prompt:
    """One request's content."""

    messages: Messages
    num_tokens: int
    max_tokens: int
    conversation: int | None = None  # which conversation a turn belongs to
    turn: int | None = None  # 1 for a conversation's first request
    group: int | None = None  # which shared system prompt it starts with


class Workload(Protocol):
    num_users: int | None  # closed-loop users it defines itself, else None
    is_keep_text: bool  # needs each answer's text (for the next turn)

    def next(self, rng: random.Random, index: int, user: int | None) -> Prompt: ...

    def answered(self, user: int | None, prompt: Prompt, text: str, num_tokens: int) -> None: ...

    def describe(self) -> str: ...


Question = Callable[[random.Random, int], tuple[str, int]]  # (rng, index) -> (text, tokens)


def word_questions(builder: PromptBuilder, lengths: LengthDistribution) -> Question:
    def question(rng: random.Random, index: int) -> tuple[str, int]:
        num_tokens = lengths.sample(rng, index)
        return builder.build(num_tokens), num_tokens
    return question


class Synthetic:
    """One user message of random words per request (see prompts.py)."""

    num_users = None
    is_keep_text = False

    def __init__(self, question: Question, outputs: LengthDistribution, description: str) -> None:
        self.question = question
        self.outputs = outputs
        self.description = description

    def next(self, rng: random.Random, index: int, user: int | None) -> Prompt:
        text, num_tokens = self.question(rng, index)
        return Prompt((("user", text),), num_tokens, self.outputs.sample(rng, index))

    def answered(self, user: int | None, prompt: Prompt, text: str, num_tokens: int) -> None:
        pass

    def describe(self) -> str:
        return self.description


class SharedPrefix:
    """`num_prefixes` system prompts of `prefix_tokens` words, each shared by
    `users_per_prefix` users; user u belongs to group u % num_prefixes."""

    is_keep_text = False

    def __init__(self, builder: PromptBuilder, num_prefixes: int, users_per_prefix: int,
                 prefix_tokens: int, question: Question, outputs: LengthDistribution) -> None:
        if num_prefixes < 1 or users_per_prefix < 1 or prefix_tokens < 1:
            raise BenchError("--shared-prefix NxM and --prefix-tokens must be positive")
        specials = builder.calibration.num_specials
        self.prefixes = [builder.build(prefix_tokens + specials) for _ in range(num_prefixes)]
        self.prefix_tokens = prefix_tokens
        self.num_users = num_prefixes * users_per_prefix
        self.question = question
        self.outputs = outputs

    def next(self, rng: random.Random, index: int, user: int | None) -> Prompt:
        group = (index if user is None else user) % self.num_users % len(self.prefixes)
        text, num_tokens = self.question(rng, index)
        return Prompt((("system", self.prefixes[group]), ("user", text)),
                      self.prefix_tokens + num_tokens, self.outputs.sample(rng, index), group=group)

    def answered(self, user: int | None, prompt: Prompt, text: str, num_tokens: int) -> None:
        pass

    def describe(self) -> str:
        return (f"{len(self.prefixes)} shared system prompts of {self.prefix_tokens} tokens x "
                f"{self.num_users // len(self.prefixes)} users each")


@dataclass
class _History:
    conversation: int
    messages: Messages = ()
    num_tokens: int = 0
    turn: int = 0


@dataclass
class Conversations:
    """Conversations of `turns` turns, one at a time per closed-loop user. A question's
    token count includes the tokenizer's `num_specials` (a BOS), which a history holds once."""

    turns: int
    question: Question
    outputs: LengthDistribution
    num_specials: int = 0
    num_users = None
    is_keep_text = True
    histories: dict[int, _History] = field(default_factory=dict)
    num_conversations: int = 0

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise BenchError(f"--turns {self.turns}: a conversation needs at least one turn")

    def next(self, rng: random.Random, index: int, user: int | None) -> Prompt:
        if user is None:
            raise BenchError("--turns needs closed-loop users (--users): a turn waits for the last answer")
        history = self.histories.get(user)
        if history is None or history.turn >= self.turns:
            history = self.histories[user] = _History(self.num_conversations)
            self.num_conversations += 1
        text, num_tokens = self.question(rng, index)
        if history.turn:
            num_tokens -= self.num_specials
        return Prompt(history.messages + (("user", text),), history.num_tokens + num_tokens,
                      self.outputs.sample(rng, index), history.conversation, history.turn + 1)

    def answered(self, user: int | None, prompt: Prompt, text: str, num_tokens: int) -> None:
        history = self.histories.get(user)
        if history is None or history.conversation != prompt.conversation:
            return
        history.messages = prompt.messages + (("assistant", text.strip()),)
        history.num_tokens = prompt.num_tokens + num_tokens
        history.turn = prompt.turn

    def describe(self) -> str:
        return f"conversations of {self.turns} turns, the history resent each turn"
