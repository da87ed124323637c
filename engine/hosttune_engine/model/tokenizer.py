"""A Hugging Face tokenizer folder: tokenizer.json, special tokens and the chat template."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property
from pathlib import Path

from hosttune_engine.errors import ModelLoadError
from hosttune_engine.model.byte_bound import byte_bound, char_bound
from hosttune_engine.model.text_cuts import text_cuts
from hosttune_engine.model.word_cuts import word_cuts


def _token_text(value, name: str, path: Path) -> str | None:
    text = value.get("content") if isinstance(value, dict) else value
    if text is not None and not isinstance(text, str):
        raise ModelLoadError(f"{path}: {name} must be a string (or an object with its content), got {text!r}")
    return text


LONG_DECODE = 4096  # longer id lists are decoded without holding the GIL
PIECE_CHARS = 65_536  # count_past tokenizes pieces of about this many characters
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters and the bytes they stand for: printable Latin-1 bytes are themselves, the
    rest are the characters from U+0100 on, in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = (b for b in range(256) if b not in printable)
    return {**{chr(b): b for b in printable}, **{chr(0x100 + i): b for i, b in enumerate(shifted)}}


BYTE_LEVEL = _byte_level_alphabet()


def _tokenizer_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path}: holds a JSON {type(cfg).__name__}, not an object of tokenizer settings")
    return cfg


class Tokenizer:
    """Encode, decode and render chat prompts the way transformers' fast tokenizer does."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no tokenizer.json (only fast tokenizers are supported)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception for a malformed file
            raise ModelLoadError(f"{path}: cannot read it as a tokenizer: {e}") from None
        cfg_path = folder / "tokenizer_config.json"
        cfg = _tokenizer_config(cfg_path)
        self.bos_token = _token_text(cfg.get("bos_token"), "bos_token", cfg_path)
        self.eos_token = _token_text(cfg.get("eos_token"), "eos_token", cfg_path)
        self.chat_template, source = self._find_chat_template(folder, cfg, cfg_path)
        if self.chat_template:
            self._check_compiles(source)

    def _check_compiles(self, source: Path) -> None:
        """Compile the template now: one that does not is the folder's to fix, not each chat request's."""
        from jinja2.exceptions import TemplateSyntaxError

        try:
            self._template
        except TemplateSyntaxError as e:
            raise ModelLoadError(f"{source}: chat template line {e.lineno}: {e.message}") from None

    @staticmethod
    def _find_chat_template(folder: Path, cfg: dict, cfg_path: Path) -> tuple[str | None, Path]:
        """The template and the file it is in."""
        template = cfg.get("chat_template")
        named = isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str)
                                                   for t in template)
        if not (template is None or isinstance(template, str) or named):
            raise ModelLoadError(f"{cfg_path}: chat_template must be a string or an array of named templates "
                                 "({\"name\", \"template\"})")
        if named:
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            try:
                return jinja_file.read_text(encoding="utf-8"), jinja_file
            except (OSError, UnicodeDecodeError) as e:
                raise ModelLoadError(f"{jinja_file}: cannot read it as UTF-8 text: {e}") from None
        return template, cfg_path

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.token_to_id(self.eos_token) if self.eos_token else None

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes one token stands for, where it holds part of a character too (its text shows U+FFFD):
        OpenAI's logprob `bytes`, whose concatenation over a sequence is its text."""
        token = self._tok.id_to_token(token_id)
        if token is None or token_id in self._added_ids:
            return self.decode([token_id], skip_special_tokens=False).encode()
        if self._is_byte_level and all(c in BYTE_LEVEL for c in token):
            return bytes(BYTE_LEVEL[c] for c in token)
        byte = BYTE_TOKEN.fullmatch(token)
        return bytes([int(byte.group(1), 16)]) if byte else self.token_text(token_id).encode()

    def token_text(self, token_id: int) -> str:
        """One token's text as it stands in a longer text (logprobs' tokens, whose lengths make `text_offset`): a
        SentencePiece token's space mark is a space, where decoding the token alone drops a leading one."""
        token = self._tok.id_to_token(token_id)
        if self._space_mark is None or token is None or token_id in self._added_ids or BYTE_TOKEN.fullmatch(token):
            return self.decode([token_id], skip_special_tokens=False)
        return token.replace(self._space_mark, " ")

    @cached_property
    def _space_mark(self) -> str | None:
        """The character a SentencePiece decoder (Metaspace, or Replace then Strip) makes a space; None for others."""
        try:
            state = json.loads(self._tok.decoder.__getstate__()) if self._tok.decoder is not None else {}
        except Exception:  # a custom (Python) decoder cannot be read
            return None
        for part in state.get("decoders", []) if state.get("type") == "Sequence" else [state]:
            mark = part.get("replacement") if part.get("type") == "Metaspace" else None
            if part.get("type") == "Replace" and part.get("content") == " ":
                mark = (part.get("pattern") or {}).get("String")
            if isinstance(mark, str) and len(mark) == 1:
                return mark
        return None

    @cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self._tok.get_added_tokens_decoder())

    @cached_property
    def _is_byte_level(self) -> bool:
        return type(self._tok.decoder).__name__ == "ByteLevel"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch lets go of the GIL while it works (encode holds it), so a long text tokenized on a worker
        # thread does not stop the server's event loop for seconds
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def count_past(self, text: str, limit: int) -> int | None:
        """A count of more than `limit` tokens that `text` has at least: from its bytes or characters where that
        shows it (see `byte_bound`), else in its leading pieces, tokenizing a piece at a time and stopping there;
        None if none was found: the pieces hold no more, or this tokenizer gives no place to cut (see
        `word_cuts`, `text_cuts`)."""
        if self._token_bound is not None and (fewest := self._token_bound.fewest_tokens(text)) > limit:
            return fewest
        count = 0
        for num_tokens in self._piece_counts(text):
            count += num_tokens  # the whole adds special tokens, never drops any
            if count > limit:
                return count
        return None

    def _piece_counts(self, text: str):
        """The tokens of a text's leading pieces, at spaces between words where the pre-tokenizer always splits
        there, else (a text with none, such as Japanese) after special tokens."""
        num_pieces = 0
        if self._word_cuts is not None:
            for num_pieces, (_, num_tokens) in enumerate(self._word_cuts.pieces(text, PIECE_CHARS), 1):
                yield num_tokens
        if self._text_cuts is not None and num_pieces == 0:
            yield from (self._count(piece) for piece in self._text_cuts.pieces(text, PIECE_CHARS))

    def _count(self, text: str) -> int:
        return len(self.encode(text, add_special_tokens=False))

    @cached_property
    def _word_cuts(self):
        return word_cuts(self._tok, self._count)

    @cached_property
    def _text_cuts(self):
        return text_cuts(self._tok)

    @cached_property
    def _token_bound(self):
        """Byte-level BPE's bound from a text's bytes, else SentencePiece's from its characters, else None."""
        return byte_bound(self._tok, BYTE_LEVEL) or char_bound(self._tok)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) < LONG_DECODE:  # the detokenizer's calls, a few ids each step
            return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        # decode_batch lets go of the GIL while it works (decode holds it), as encode_batch does
        return self._tok.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """Render `messages` with the model's chat template (Jinja, sandboxed, like transformers)."""
        if not self.chat_template:
            raise ModelLoadError("this tokenizer has no chat template (tokenizer_config.json chat_template)")
        # the caller's arguments win over the special tokens, as in transformers
        variables = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kwargs}
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)

    @cached_property
    def _template(self):
        """The chat template, compiled once: compiling takes milliseconds, rendering microseconds."""
        return _compile(self.chat_template)


def _compile(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
