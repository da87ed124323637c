"""Turning request prompts into token ids: text, token ids or chat messages, checked against the context.

Context errors use vLLM's wording, so clients that parse it keep working.
"""

from __future__ import annotations

from hosttune_engine.server.api_errors import ApiError, bad_request
from hosttune_engine.server.bodies import OFFLOAD_IDS, off_loop
from hosttune_engine.server.schemas.completion import Prompt

OFFLOAD_CHARS = 20_000  # longer texts are tokenized off the event loop, so 429s stay fast meanwhile
OFFLOAD_MESSAGES = 64  # chats with more messages (or OFFLOAD_CHARS of content) are rendered off the event loop
# a text of more characters than this many per token of the context is first bounded from its bytes, or counted a
# piece at a time, so one far over it is refused without tokenizing it all; few texts that fit average as many
EARLY_COUNT_CHARS_PER_TOKEN = 8


class PromptBuilder:
    def __init__(self, tokenizer, max_model_len: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    # -- text and chat ---------------------------------------------------------------------
    def _need_tokenizer(self, what: str = "text prompts; send token ids instead", param: str = "prompt"):
        if self.tokenizer is None:
            raise bad_request(f"this model has no tokenizer (tokenizer.json) for {what}", param)
        return self.tokenizer

    async def encode(self, prompt: Prompt, add_special_tokens: bool = True, param: str = "prompt",
                     within_context: bool = False) -> list[int]:
        """Token ids of a text or token-id prompt; the ids are checked against the vocabulary. `param` is the field
        an error names. `within_context`: a long text certain to fill the context is refused before it is all
        tokenized (`max_tokens_for` checks the rest)."""
        if not isinstance(prompt, str):
            return self.check_ids(list(prompt))
        tok = self._need_tokenizer()
        try:
            if len(prompt) < OFFLOAD_CHARS:
                return tok.encode(prompt, add_special_tokens=add_special_tokens)
            if within_context and len(prompt) > EARLY_COUNT_CHARS_PER_TOKEN * self.max_model_len:
                await self._refuse_past_context(tok, prompt, param)
            return await off_loop(tok.encode, prompt, add_special_tokens)
        except (TypeError, UnicodeError):  # JSON allows lone surrogates ("\ud800"); tokenizers do not
            raise bad_request(f"{param}: not valid Unicode (a lone surrogate escape?)", param) from None

    async def _refuse_past_context(self, tok, text: str, what: str) -> None:
        count = await off_loop(tok.count_past, text, self.max_model_len - 1)
        if count is not None:
            raise _context_error(self.max_model_len, f"at least {count}", what)

    def render_chat(self, messages, add_generation_prompt: bool = True, template_kwargs: dict | None = None,
                    continue_final: bool = False) -> str:
        """The chat as the template writes it; with `continue_final`, cut after the final message's text, so the
        model goes on with that message (vLLM's continue_final_message)."""
        tok = self._need_tokenizer("chat messages; send token ids to /v1/completions", "messages")
        if not tok.chat_template:
            raise bad_request("this model has no chat template; use /v1/completions", "messages")
        # the request's chat_template_kwargs are the template's own arguments: they win, as in vLLM
        arguments = {"add_generation_prompt": add_generation_prompt, **(template_kwargs or {})}
        try:
            text = tok.apply_chat_template(list(messages), **arguments)
        except Exception as e:  # the template is user-facing Jinja: any failure is about the messages
            raise bad_request(f"the chat template could not render these messages: {str(e)[:200]}",
                              "messages") from None
        return _cut_after(text, messages[-1]["content"]) if continue_final else text

    async def encode_chat(self, messages, add_generation_prompt: bool = True, template_kwargs: dict | None = None,
                          add_special_tokens: bool = False, within_context: bool = False,
                          continue_final: bool = False) -> list[int]:
        # The template writes BOS itself where the model wants one, as in vLLM: no special tokens unless asked.
        args = (messages, add_generation_prompt, template_kwargs, continue_final)
        text = await off_loop(self.render_chat, *args) if _is_long_chat(messages) else self.render_chat(*args)
        return await self.encode(text, add_special_tokens, "messages", within_context)

    def check_logprobs(self, logprobs: int | None) -> None:
        """Logprobs show each token as text: without a tokenizer there is none to show."""
        if logprobs is not None:
            self._need_tokenizer("logprobs, which show each token as text; ask without logprobs", "logprobs")

    def check_logit_bias(self, bias: tuple[tuple[int, float], ...]) -> None:
        bad = next((t for t, _ in bias if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise bad_request(f"logit_bias: token id {str(bad)[:24]} is out of the vocabulary [0, {self.vocab_size})",
                              "logit_bias")

    async def decode(self, ids) -> str:
        """The text of token ids (/detokenize); many ids are checked and decoded off the event loop."""
        tok = self._need_tokenizer("turning token ids into text", "tokens")
        if len(ids) < OFFLOAD_IDS:
            return self._decode(tok, ids)
        return await off_loop(self._decode, tok, ids)

    def _decode(self, tok, ids) -> str:
        return tok.decode(self.check_ids(list(ids), "tokens"), skip_special_tokens=False)

    def check_ids(self, ids: list[int], param: str = "prompt") -> list[int]:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise bad_request(f"token id {str(bad)[:24]} is out of the vocabulary [0, {self.vocab_size})", param)
        return ids

    # -- context length ------------------------------------------------------------------------
    def max_tokens_for(self, num_prompt_tokens: int, requested: int | None, default: int | None,
                       what: str = "prompt", field: str = "max_tokens") -> int:
        """The max_tokens to run with; a 400 if the prompt, or prompt plus max_tokens, exceeds the context.
        `field` is the body's field that asked for `requested`, the one the 400 names."""
        if num_prompt_tokens == 0:
            raise bad_request(f"the {what} is empty", "prompt" if what == "prompt" else what)
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise _context_error(self.max_model_len, str(num_prompt_tokens), what)
        if requested is None:
            return room if default is None else min(default, room)
        if requested > room:
            raise ApiError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                f"you requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in "
                                f"the {what}, {requested} in the completion). Please reduce the length of the "
                                f"{what} or completion.", param=field)
        return requested


def _cut_after(text: str, final: str) -> str:
    """`text` up to the end of its last copy of `final`, as transformers' continue_final_message cuts it: after the
    message as sent where the template kept its spacing, else after it stripped."""
    at = text.rfind(final.strip())
    if at < 0:
        raise bad_request("continue_final_message is set but the chat template does not write the final message "
                          "as sent, so there is nothing to continue", "messages")
    kept = len(final.lstrip())
    return text[:at + kept] if text[at:at + kept] == final else text[:at + len(final.strip())]


def _context_error(max_model_len: int, num_tokens: str, what: str) -> ApiError:
    return ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your request "
                         f"has {num_tokens} input tokens. Please reduce the length of the input {what}.", param=what)


def _is_long_chat(messages) -> bool:
    """Whether rendering `messages` could hold the event loop for long (250,000 messages take most of a second)."""
    return len(messages) > OFFLOAD_MESSAGES or sum(len(m["content"]) for m in messages) >= OFFLOAD_CHARS
