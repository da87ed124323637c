"""Prompts of an exact token count, made of random common English words.

How exactness is had: the words are checked, once per run, to be one token each with
the target's tokenizer (its `/tokenize` endpoint, or a local tokenizer.json), and the
number of tokens the tokenizer adds to any text (a BOS; for the chat API, the chat
template around one user message) is measured. Since tokenizers split
on spaces before merging, a prompt of n tokens is then `n - specials` such words, and a
few built prompts are tokenized again to check. When neither tokenizer is available
the count is an approximation (one token per word, one special token), and the report
says so; the server's usage numbers then show the real count.

Prompts are slices of one long random text at a random word offset, so that no two
requests share a prefix (prefix caching cannot flatter the server) and building a
prompt costs no tokenizer call and almost no time during the run.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp

from hosttune.errors import BenchError

# Common words that are a single token, with a leading space, in the GPT-2, Llama,
# Mistral and Qwen vocabularies; each is checked against the real tokenizer anyway.
WORDS = tuple("""
the of and to in is was for that with as on by at from his he it an are were which be
this has had not but its they or one have first new their after also who two been her
she more time other all into year there would when can only most about over up some
out than may then made used three many most people these no world him so such during
state later known city like school part where between under well year while back
where them any through before both could what four because each best found before
around since film work life team years called high name music day did over five game
again state great area among house same series did work set main end even without
""".split())

# Letters and digits: small vocabularies (test models) keep few whole words as one token.
FALLBACK_WORDS = tuple("abcdefghijklmnopqrstuvwxyz0123456789")

Counter = Callable[[str], Awaitable[int]]


@dataclass(frozen=True)
class Calibration:
    """What the tokenizer told us about the word list."""

    words: tuple[str, ...]  # words that are one token each
    num_specials: int  # tokens the tokenizer adds to any prompt (BOS, ...)
    source: str  # how counts were made, for the report
    is_exact: bool


class PromptBuilder:
    """Builds prompts of a given token count from one long random text."""

    def __init__(self, calibration: Calibration, max_tokens: int, seed: int) -> None:
        self.calibration = calibration
        rng = random.Random(seed)
        num_words = max_tokens + 4096  # room for many distinct offsets
        words = rng.choices(calibration.words, k=num_words)
        self.text = " ".join(words)
        self.starts = _word_starts(words)  # char offset of word i; one past the end last
        self.rng = rng

    def num_words(self, num_tokens: int) -> int:
        return max(1, num_tokens - self.calibration.num_specials)

    def build(self, num_tokens: int) -> str:
        """A prompt the tokenizer counts as `num_tokens` tokens (at least one word)."""
        count = self.num_words(num_tokens)
        offset = self.rng.randrange(len(self.starts) - count)
        return self.text[self.starts[offset]:self.starts[offset + count] - 1]


def _word_starts(words: list[str]) -> list[int]:
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    starts.append(position)
    return starts


async def calibrate(count: Counter, source: str) -> Calibration:
    """Find the number of special tokens and the candidates that are one token each."""
    num_specials = await _count_specials(count)
    candidates = tuple(dict.fromkeys(WORDS + FALLBACK_WORDS))
    if await count(" ".join(candidates)) == num_specials + len(candidates):
        words = candidates  # each is at least one token, so each is exactly one
    else:
        words = await _single_token_words(count, candidates, num_specials)
    if len(words) < 2:
        raise BenchError(f"{source}: no words that are one token each; cannot make prompts exact "
                         "(pass --tokenizer, or use a target without /tokenize for approximate lengths)")
    return Calibration(words, num_specials, source, is_exact=True)


async def _count_specials(count: Counter) -> int:
    """Tokens the tokenizer adds to any text: the count of an empty prompt, or else one
    less than the shortest count among a few one-character prompts."""
    try:
        return await count("")
    except (BenchError, aiohttp.ClientError, ValueError, KeyError):
        return min([await count(w) for w in FALLBACK_WORDS[:8]]) - 1


async def _single_token_words(count: Counter, candidates: tuple[str, ...],
                              num_specials: int) -> tuple[str, ...]:
    """Candidates that stay one token each both first and after a space (4 in a row)."""
    counts = []
    for start in range(0, len(candidates), 16):  # a few requests at a time
        batch = candidates[start:start + 16]
        counts += await asyncio.gather(*(count(" ".join([w] * 4)) for w in batch))
    return tuple(w for w, n in zip(candidates, counts) if n == num_specials + 4)


def approximate_calibration() -> Calibration:
    return Calibration(
        tuple(dict.fromkeys(WORDS)), 1,
        "approximate: no /tokenize endpoint and no --tokenizer; assumed one token per "
        "word plus one BOS token", is_exact=False,
    )


async def check(builder: PromptBuilder, count: Counter, lengths: list[int]) -> None:
    """Tokenize prompts of the given lengths again; raise if any count is off."""
    for length in lengths:
        got = await count(builder.build(length))
        wanted = max(length, builder.calibration.num_specials + 1)
        if got != wanted:
            raise BenchError(
                f"a prompt built to {wanted} tokens counts {got} with "
                f"{builder.calibration.source}; the word list does not suit this tokenizer"
            )


def remote_counter(session: aiohttp.ClientSession, url: str, is_chat: bool = False) -> Counter:
    """Counts tokens with the target's vLLM-style /tokenize endpoint; for chat, the text
    as one user message with the chat template applied, as the server will."""
    endpoint = url.rstrip("/") + "/tokenize"

    async def count(text: str) -> int:
        body = {"messages": [{"role": "user", "content": text}]} if is_chat else {"prompt": text}
        async with session.post(endpoint, json=body) as resp:
            if resp.status != 200:
                raise BenchError(f"{endpoint} answered HTTP {resp.status}")
            body = await resp.json(content_type=None)
        return _token_count(body, endpoint)

    return count


def _token_count(body: object, endpoint: str) -> int:
    """vLLM's {"count": N} or {"tokens": [...]}; another server's /tokenize (a list of token objects, say) is none."""
    count = body.get("count") if isinstance(body, dict) else None
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if isinstance(tokens, list):
        return len(tokens)
    raise BenchError(f"{endpoint} answered no token count (vLLM's \"count\" or \"tokens\")")


async def has_tokenize(session: aiohttp.ClientSession, url: str, is_chat: bool = False) -> bool:
    try:
        return await remote_counter(session, url, is_chat)("the") >= 1
    except (aiohttp.ClientError, BenchError, ValueError, KeyError, TimeoutError):
        return False


def local_counter(path: Path) -> Counter:
    """Counts tokens with a local tokenizer.json (needs the `tokenizers` package)."""
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise BenchError(f"--tokenizer: tokenizer file {path} does not exist; give a tokenizer.json or its folder")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise BenchError("--tokenizer needs the `tokenizers` package: pip install tokenizers") from None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for any file it cannot read
        raise BenchError(f"--tokenizer {path}: not a tokenizer.json ({exc})") from None

    async def count(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    return count
