"""The offline API: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hosttune_engine.config import EngineConfig
from hosttune_engine.core.engine import Engine
from hosttune_engine.core.messages import EngineRequest, TokenLogprob
from hosttune_engine.errors import RequestError
from hosttune_engine.sampling import SamplingParams


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    stop_reason: str | int | None
    logprobs: tuple[TokenLogprob, ...] | None
    num_cached_tokens: int


class LLM:
    """Generate for a batch of prompts with one engine, all requests batched together.

    Example: LLM(model="/models/qwen2.5-7b").generate(["Hello"], SamplingParams(temperature=0))

    With `tensor_parallel_size=N` it starts N - 1 more processes, one per GPU: `shutdown()` (or a `with`
    block) stops them.
    """

    def __init__(self, model: str, **engine_options):
        self.engine = Engine(EngineConfig(model=model, **engine_options))
        self._ids = itertools.count()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.engine.shutdown()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 priorities: list[int] | None = None) -> list[RequestOutput]:
        """prompts: a string, a list of strings, or a list of token-id lists. Outputs keep their order."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise RequestError(f"{len(params)} sampling params for {len(prompts)} prompts")
        order = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            ids = self._encode(prompt)
            rid = f"llm-{next(self._ids)}"
            self.engine.add_request(EngineRequest(rid, ids, p, priority=(priorities or [0] * len(prompts))[i]))
            order.append((rid, prompt if isinstance(prompt, str) else None, ids))
        return self._collect(order)

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("text prompts need a tokenizer; pass token id lists instead")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def _collect(self, order) -> list[RequestOutput]:
        acc = {rid: {"text": [], "ids": [], "lps": [], "out": None} for rid, _, _ in order}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                a = acc[out.request_id]
                a["text"].append(out.new_text)
                a["ids"].extend(out.new_token_ids)
                a["lps"].extend(out.new_logprobs or ())
                a["out"] = out
        results = []
        for rid, prompt, ids in order:
            a, last = acc[rid], acc[rid]["out"]
            results.append(RequestOutput(
                request_id=rid, prompt=prompt, prompt_token_ids=tuple(ids), text="".join(a["text"]),
                token_ids=tuple(a["ids"]), finish_reason=last.finish_reason, stop_reason=last.stop_reason,
                logprobs=tuple(a["lps"]) if a["lps"] else None, num_cached_tokens=last.num_cached_tokens))
        return results
