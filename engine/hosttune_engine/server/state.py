"""What the HTTP handlers share: config, the engine client, prompts, admission, metrics and health."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import contextmanager

from aiohttp import web

from hosttune_engine.config import EngineConfig
from hosttune_engine.core.messages import EngineStats, TokenLogprob
from hosttune_engine.errors import EngineError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.server.admission import Admission
from hosttune_engine.server.config import ServerConfig
from hosttune_engine.server.engine_client import EngineClient
from hosttune_engine.server.generation import Generation
from hosttune_engine.server.health import Health, Phase
from hosttune_engine.server.metrics import Metrics
from hosttune_engine.server.prompts import PromptBuilder
from hosttune_engine.server.responses import LogprobEntry, TokenText
from hosttune_engine.server.sampling_defaults import SamplingDefaults
from hosttune_engine.server.api_errors import ApiError, bad_request

log = logging.getLogger("hosttune_engine.server")

UNAVAILABLE = {Phase.STARTING: ("starting", "The server is loading the model; retry shortly"),
               Phase.WARMING_UP: ("starting", "The server is warming up; retry shortly"),
               Phase.DRAINING: ("draining", "The server is shutting down; send this request elsewhere"),
               Phase.FAILED: ("draining", "The engine failed; the server is exiting")}


class ServerState:
    def __init__(self, config: ServerConfig, health: Health | None = None):
        self.config = config
        self.model_name = config.model_name  # the first served name: answers and metrics say it
        self.model_names = config.model_names  # any of which a request may name
        self.health = health or Health()
        self.admission = Admission(config.max_batch_size, config.max_queue, config.retry_after_s)
        self.metrics = Metrics(self.model_name)
        self.created = int(time.time())
        self.client: EngineClient | None = None
        self.prompts: PromptBuilder | None = None
        self.sampling_defaults = SamplingDefaults.read(config.sampling_defaults_folder)  # what requests leave out
        self.max_model_len = planned_context(config.engine)  # known before the weights load; the engine's, once up
        self.generations: set[Generation] = set()  # in flight, so a drain that times out can abort them
        self._tokens: dict[int, TokenText] = {}  # by id, as logprobs show them
        self._settling: set[asyncio.Task] = set()  # metrics of requests whose client left, waiting for the engine

    def attach(self, client: EngineClient, tokenizer, max_model_len: int, vocab_size: int) -> None:
        """The engine is loaded: from now on handlers can tokenize and generate."""
        self.client = client
        self.max_model_len = max_model_len
        self.prompts = PromptBuilder(tokenizer, max_model_len, vocab_size)

    def stats(self) -> EngineStats | None:
        return self.client.stats() if self.client else None

    # -- gates, in the order a generation request meets them ----------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise ApiError(404, f"The model `{name[:100]}` does not exist.", "NotFoundError", "model")

    def check_serving(self) -> None:
        """A 503 unless ready: while starting, warming up, draining or failed."""
        if self.health.is_ready:
            return
        reason, message = UNAVAILABLE[self.health.phase]
        self.metrics.reject(reason)
        raise ApiError(503, message, "ServiceUnavailableError")

    @contextmanager
    def admitted(self, n: int, num_prompts: int):
        """Hold n times `num_prompts` admission slots for the block, or raise the 429 (or a 400 if it can never fit)."""
        num_seqs = n * num_prompts
        if not self.admission.fits_ever(num_prompts):
            raise bad_request(f"this request sends {num_prompts} prompts; the server takes at most "
                              f"{self.admission.capacity} at once", "prompt")
        if not self.admission.fits_ever(num_seqs):
            asked = (f"n={n} sequences" if num_prompts == 1
                     else f"{num_seqs} sequences (n={n} times {num_prompts} prompts)")
            raise bad_request(f"this request asks for {asked}; the server takes at most {self.admission.capacity} "
                              "at once", "n")
        rejected = self.admission.admit(num_seqs)
        if rejected is not None:
            self.metrics.reject("overload")
            raise ApiError(429, rejected.message, "RateLimitError")
        with self.admission.holding(num_seqs):
            yield

    def usable_prompts(self) -> PromptBuilder:
        if self.prompts is None:
            raise ApiError(503, UNAVAILABLE[Phase.STARTING][1], "ServiceUnavailableError")
        return self.prompts

    # -- helpers for responses ------------------------------------------------------------------
    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    def shown_request_id(self, prefix: str, given: str | None) -> str | None:
        """The client's X-Request-Id as answers and the log name the request ("cmpl-" + it), as vLLM names it;
        None where it sent none. Two requests may send one id: the engine runs each by its own."""
        return f"{prefix}-{given}" if given else None

    def logprob_entries(self, logprobs: list[TokenLogprob]) -> list[LogprobEntry]:
        return [LogprobEntry(self._token(lp.token_id), lp.logprob, tuple((self._token(t), v) for t, v in lp.top))
                for lp in logprobs]

    def _token(self, token_id: int) -> TokenText:
        token = self._tokens.get(token_id)
        if token is None:
            tok = self.prompts.tokenizer
            token = self._tokens[token_id] = TokenText(tok.token_text(token_id), tok.token_bytes(token_id))
        return token

    def abort_all(self) -> None:
        for gen in self.generations:
            gen.abort()

    # -- the end of a request ---------------------------------------------------------------------
    def finish(self, gen: Generation, status: int, prompt_text: str | None = None) -> None:
        """Write the request's one log line and observe each sequence's timings. Sequences the handler left
        running (the client went away) are observed once the engine's last output for them arrives, so the tokens
        the engine made meanwhile count in the per-request histograms as they do in its counters."""
        self.generations.discard(gen)
        self._log(gen, status, prompt_text)
        if gen.is_finished or self.client is None or self.client.error is not None:
            self._observe(gen)
            return
        task = asyncio.get_running_loop().create_task(self._observe_when_finished(gen))
        self._settling.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._settling.discard)

    async def _observe_when_finished(self, gen: Generation) -> None:
        try:
            async for _ in gen.updates():
                pass
        except Exception:  # the engine refused or died: what arrived is what there is
            pass
        self._observe(gen)

    def _observe(self, gen: Generation) -> None:
        now = time.monotonic()
        for choice in gen.choices:
            if not choice.refused:  # a 400 the engine gave is no served request, as one the server gave
                self.metrics.observe(choice.timing(now))

    def _log(self, gen: Generation, status: int, prompt_text: str | None) -> None:
        now = time.monotonic()
        firsts = [c.first_token_time for c in gen.choices if c.first_token_time]
        ttft = f"{min(firsts) - gen.arrival:.3f}s" if firsts else "-"
        reasons = ",".join(sorted({c.finish_reason or "abort" for c in gen.choices}))
        line = (f"request {gen.shown_id} status={status} n={len(gen.choices)} prompt_tokens={gen.num_prompt_tokens}"
                f" output_tokens={gen.num_output_tokens} ttft={ttft} total={now - gen.arrival:.3f}s finish={reasons}")
        if self.config.log_prompts and prompt_text is not None:
            line += f" prompt={prompt_text[:4000]!r}"
        log.info(line)


def planned_context(engine: EngineConfig) -> int | None:
    """The context the engine will serve, from --max-model-len and config.json alone (as the model runner sizes
    it), so /v1/models can say it while the weights load; None where config.json cannot say (the load fails)."""
    try:
        return ModelConfig.from_folder(engine.model).context_length(engine.max_model_len)
    except EngineError:
        return None


STATE = web.AppKey("state", ServerState)
