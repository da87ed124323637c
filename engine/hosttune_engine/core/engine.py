"""The engine loop: requests in, one scheduled model step at a time, token outputs out.

Each `step()` collects step N (launched by the previous call), schedules and
launches step N+1, and builds step N's outputs while the device computes step
N+1, which is still running when `step()` returns (deferred output processing).
When step N left its tokens on the device (the graph paths do), step N+1 is
scheduled and launched even before step N is collected, its decodes taking
step N's tokens there (`Scheduler.schedule_ahead`), so the device does not wait
for the host between the two.
Callers talk to it only with the message dataclasses of `core.messages`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hosttune_engine.core.block_manager import BlockManager
from hosttune_engine.core import kernel_compiles
from hosttune_engine.config import EngineConfig
from hosttune_engine.core.detokenizer import IncrementalDetokenizer
from hosttune_engine.core.messages import AbortRequest, EngineRequest, EngineStats, TokenLogprob, TokenOutput
from hosttune_engine.core.model_runner import LaunchedStep, ModelRunner, StepResult, context_length
from hosttune_engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.step_log import StepLog
from hosttune_engine.errors import RequestError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.model.tokenizer import Tokenizer

log = logging.getLogger("hosttune_engine.engine")


@dataclass
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer | None


@dataclass
class _InFlight:
    """A launched step, collected by the next `step` call."""

    sched: SchedulerOutput
    launched: LaunchedStep
    ahead: bool = False  # the next step was scheduled before this one was collected
    since: float | None = None  # when the tokens of the step before reached the host (time.monotonic)


@dataclass
class _Collected:
    """A collected step whose outputs are not built yet: `step` builds them while the next step runs."""

    seqs: list[Sequence]  # those that got a token, in scheduled order
    sched: SchedulerOutput
    result: StepResult


class Engine:
    """One model on one device, serving many requests with continuous batching.

    Pairs: `add_request` / `abort_request`; `step` until `has_unfinished_requests`
    is False. `stats()` gives the counters metrics are made of. With
    `tensor_parallel_size` > 1 this process is rank 0 of several (one per GPU);
    `shutdown` stops the others. With `max_step_ms` set, the step costs are
    measured at the end of construction, or, with `measure_step_costs=False`,
    when the caller calls `measure_step_costs` (a server does after its warmup,
    when every kernel is compiled: it times each step shape once).
    """

    def __init__(self, config: EngineConfig, measure_step_costs: bool = True):
        self.config = config
        self.model_config = ModelConfig.from_folder(config.model)
        context_length(config, self.model_config)  # before any rank starts
        self.tokenizer = _load_tokenizer(config)
        self.kernel_compiles = kernel_compiles.install()  # before the first kernel launch
        self.workers = None
        self.runner = self._start_runner()
        self.max_model_len = self.runner.max_model_len
        # as vLLM: the tokenizer's EOS ends a sequence with no stop_reason; the model's other end tokens are stop tokens
        eos = self.tokenizer.eos_token_id if self.tokenizer else None
        eos_ids = () if eos is None else (eos,)
        others = tuple(t for t in self.model_config.eos_token_ids if t != eos)
        self.runner.eos_token_ids = eos_ids + others
        self.block_manager = BlockManager(self.runner.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
                            config.scheduling_policy),
            self.block_manager, eos_token_ids=eos_ids, eos_stop_token_ids=others)
        graphs = self.runner.mixed_graphs
        self.scheduler.budgeted_tokens = graphs.sizes[-1] if graphs is not None and graphs.sizes else None
        self.requests: dict[str, _Request] = {}
        self._pending: list[TokenOutput] = []  # built, to go out with the next step
        self._in_flight: _InFlight | None = None
        self._prompt_tokens = self._generation_tokens = self._finished = 0
        self.step_log = StepLog(config.step_log) if config.step_log else None
        if config.max_step_ms is not None and measure_step_costs:
            self.measure_step_costs()

    @property
    def needs_step_costs(self) -> bool:
        """A step budget is set and its cost model not measured yet."""
        return self.config.max_step_ms is not None and self.scheduler.cost_model is None

    def measure_step_costs(self, runs: int | None = None):
        """Time synthetic steps and give the scheduler their cost model and the step time budget
        (core/step_cost.py); returns the model. Only on an idle engine (no request in it). `runs` per step
        shape (default: the fastest of a few, since a first run may compile or meet a one-off cost)."""
        from hosttune_engine.core.step_cost import StepProbe, measure_step_costs

        if self.has_unfinished_requests():
            raise RuntimeError("step costs are measured on an idle engine")
        cfg = self.config
        probe = StepProbe(self.runner, self.block_manager, cfg.max_num_batched_tokens, self.max_model_len)
        on_cuda = self.runner.device.type == "cuda"
        decode_batch = max(1, min(64 if on_cuda else 8, cfg.max_num_seqs // 4))  # a quarter-full batch
        model = measure_step_costs(probe, on_cuda, self.block_manager.num_free_blocks * cfg.block_size, decode_batch,
                                   runs)
        self.scheduler.cost_model = model
        self.scheduler.config = replace(self.scheduler.config, max_step_ms=cfg.max_step_ms)
        budget = f"{cfg.max_step_ms:g} ms" if cfg.max_step_ms else (
            f"auto ({model.auto_budget_s(decode_batch, 0) * 1e3:.1f} ms)" if model.full_decode_s else "auto")
        log.info("step budget %s; step costs: %s ms at %s tokens, a decode-only step of %d %.1f ms (%.1f ms at long "
                 "context), %.3g ns per decode context token, %.3g ns per prefill pair", budget,
                 "/".join(f"{t * 1e3:.1f}" for t in model.token_seconds), "/".join(map(str, model.token_points)),
                 decode_batch, model.decode_step_s * 1e3, model.full_decode_s * 1e3, model.decode_s * 1e9,
                 model.prefill_s * 1e9)
        return model

    def limit_batched_tokens(self, tokens: int | None) -> None:
        """Schedule at most `tokens` tokens a step (never more than `max_num_batched_tokens`; None: that
        again). Only on an idle engine: warmup uses it to cut a prompt into short chunks beside decodes, the
        steps a time budget makes under traffic."""
        if self.has_unfinished_requests():
            raise RuntimeError("the token budget changes on an idle engine")
        limit = self.config.max_num_batched_tokens
        self.scheduler.config = replace(self.scheduler.config,
                                        max_num_batched_tokens=limit if tokens is None else max(1, min(tokens, limit)))

    def _start_runner(self) -> ModelRunner:
        if self.config.tensor_parallel_size == 1:
            return ModelRunner(self.config, self.model_config)
        from hosttune_engine.core.workers import start_tensor_parallel

        runner, self.workers = start_tensor_parallel(self.config, self.model_config)
        return runner

    def shutdown(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do with one GPU) and close the step log. Call it
        once no step runs."""
        if self.step_log is not None:
            self.step_log.close()
            self.step_log = None
        workers, self.workers = self.workers, None
        if workers is not None:
            workers.stop(self.runner.group)

    def check_ranks(self) -> None:
        """After a step failed: if another tensor-parallel rank died, say so and end this process (exit 1)."""
        if self.workers is not None:
            self.workers.exit_if_one_died()

    # -- messages in -----------------------------------------------------------------
    def handle(self, message: EngineRequest | AbortRequest) -> None:
        if isinstance(message, AbortRequest):
            self.abort_request(message.request_id)
        else:
            self.add_request(message)

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises RequestError if it can never be served."""
        self._validate(request)
        seq = Sequence(request.request_id, list(request.prompt_token_ids), request.sampling, request.priority,
                       request.arrival_time)
        detok = IncrementalDetokenizer(self.tokenizer, seq.token_ids, request.sampling) if self.tokenizer else None
        self.requests[request.request_id] = _Request(seq, detok)
        self.scheduler.add(seq)
        self._prompt_tokens += seq.num_prompt_tokens

    def _validate(self, request: EngineRequest) -> None:
        ids, params = request.prompt_token_ids, request.sampling
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id!r} is already in use")
        if not ids:
            raise RequestError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise RequestError(f"the prompt has {len(ids)} tokens; max_model_len is {self.max_model_len} "
                               "and at least one token must be generated")
        vocab = self.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        if params.stop and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer, and this model folder has none")
        self._check_pool_holds(len(ids), params.max_tokens)

    def _check_pool_holds(self, num_prompt_tokens: int, max_tokens: int) -> None:
        pool, blocks_for = self.block_manager.num_blocks, self.block_manager.blocks_for
        needed = blocks_for(num_prompt_tokens + 1)  # the prompt and its first token
        if needed > pool:
            raise RequestError(f"the prompt's {num_prompt_tokens} tokens need {needed} KV blocks, more than the pool's "
                               f"{pool}; shorten the prompt")
        needed = blocks_for(min(num_prompt_tokens + max_tokens, self.max_model_len))
        if needed > pool:
            raise RequestError(f"the request needs {needed} KV blocks, more than the pool's {pool}; lower max_tokens")

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its final output comes with the next step.

        A step launched by the last `step` call may still be computing this sequence on the device: its
        token is dropped when collected (postprocess skips finished sequences), and its writes into the
        freed blocks come before those of any later step (one stream), which may be given them."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish(req.seq, "abort")
        self.runner.release(request_id)
        self._pending.append(self._output(req, (), None, finished=True))
        self._finished += 1
        return True

    # -- the loop ----------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending) or self._in_flight is not None

    def step(self) -> list[TokenOutput]:
        """Collect the step launched by the previous call, launch the next one, and return the collected
        step's new tokens and text (and the outputs of aborts since the last call).

        The outputs of step N are built while the device computes step N+1, and step N+1 is left running
        when this returns. Step N's stop strings are found while building its outputs, so a sequence that hit
        one may already be in step N+1: that token is dropped. When step N's tokens are on the device, step
        N+1 is scheduled and launched before step N is collected (with tensor parallelism: only in the
        steady decode state, a decode graph step of every running sequence with no request to admit); then
        a sequence that step N ends by EOS is in step N+1 too, and that token is dropped the same way.
        Otherwise the device waits between the two steps for step N's tokens to be appended (EOS,
        max_tokens), the schedule and the input packing.
        """
        outputs, self._pending = self._pending, []
        last, self._in_flight = self._in_flight, None
        if last is not None:
            self._in_flight = self._launch_ahead(last)
        collected, now = None, None
        if last is not None:
            collected, now = self._collect(last), time.monotonic()
            self._observe(last, now)
        if self._in_flight is None:
            sched = self.scheduler.schedule()
            if not sched.is_empty:
                self._in_flight = _InFlight(sched, self.runner.launch(sched))
        if self._in_flight is not None:
            self._in_flight.since = now
        if collected is not None:
            outputs += self._build(collected)  # the device computes the step just launched meanwhile
        return outputs

    def _observe(self, flight: _InFlight, collected_at: float) -> None:
        """A collected step's real time, from the tokens of the step before (unknown after an idle engine),
        for the step budget's correction and the step log."""
        real_s = None if flight.since is None else collected_at - flight.since
        if real_s is not None:
            self.scheduler.observe_step(flight.sched, real_s)
        if self.step_log is not None:
            self.step_log.write(flight.sched, collected_at, real_s, self.scheduler.correction.scale)

    def _launch_ahead(self, last: _InFlight) -> _InFlight | None:
        """The next step, launched before `last`'s tokens are read back, or None if it cannot be (or is
        empty: the sequences left all end with `last`'s tokens)."""
        if not last.launched.feeds_next:
            return None
        sched = self.scheduler.schedule_ahead(last.sched, last.launched.mask, decodes_only=self.workers is not None)
        if sched is None:
            return None
        last.ahead = True
        if sched.is_empty:
            return None
        return _InFlight(sched, self.runner.launch(sched, after=last.launched))

    def _collect(self, flight: _InFlight) -> _Collected | None:
        """Wait for a launched step and append its tokens (EOS and max_tokens are checked here)."""
        result = self.runner.collect(flight.launched)
        seqs = self.scheduler.postprocess(flight.sched, result.tokens, ahead=flight.ahead)
        self._generation_tokens += len(seqs)
        return _Collected(seqs, flight.sched, result) if seqs else None

    def _build(self, collected: _Collected) -> list[TokenOutput]:
        logprobs = _logprobs_by_seq(collected.sched, collected.result)
        requests = self.requests
        return [self._advance(requests[seq.request_id], logprobs.get(id(seq)) if logprobs else None)
                for seq in collected.seqs]

    def _advance(self, req: _Request, logprob: TokenLogprob | None) -> TokenOutput:
        seq = req.seq
        token = seq.token_ids[-1]
        if req.detok is not None and not _ended_by_its_token(seq):
            stop = req.detok.add_token(token)
            if stop is not None and seq.is_finished:  # it also hit max_tokens: the stop string wins
                seq.finish_reason, seq.stop_reason = "stop", stop
            elif stop is not None:
                # The step launched earlier in this call may still be writing this sequence's KV into the
                # blocks freed here; its token is dropped when collected (postprocess skips finished
                # sequences). Safe: a step that gets a freed block is enqueued after that one on the same
                # stream, so its own writes and reads come after those stale writes.
                self.scheduler.finish(seq, "stop", stop_reason=stop)
        finished = seq.is_finished
        if finished:
            del self.requests[seq.request_id]
            self.runner.release(seq.request_id)
            self._finished += 1
        lps = (logprob,) if logprob is not None else None
        return self._output(req, (token,), lps, finished=finished)

    def _output(self, req: _Request, new_ids: tuple[int, ...], logprobs, finished: bool) -> TokenOutput:
        seq = req.seq
        started = seq.first_scheduled_time
        return _token_output(
            request_id=seq.request_id, new_token_ids=new_ids,
            new_text=req.detok.take_new_text(finished) if req.detok else "",
            new_logprobs=logprobs, num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=len(seq.token_ids) - seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
            finished=finished, finish_reason=seq.finish_reason if finished else None,
            stop_reason=seq.stop_reason if finished else None,
            queue_time=(started - seq.arrival_time) if started else None,
        )

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_usage=bm.usage, num_kv_blocks=bm.num_blocks, num_free_kv_blocks=bm.num_free_blocks,
            prefix_cache_queries_total=bm.num_prefix_queries, prefix_cache_hits_total=bm.num_prefix_hits,
            num_preemptions_total=self.scheduler.num_preemptions, prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._generation_tokens, num_finished_total=self._finished,
            kernel_compiles_total=self.kernel_compiles.total if self.kernel_compiles is not None else None,
        )


def _logprobs_by_seq(sched: SchedulerOutput, result: StepResult) -> dict[int, TokenLogprob]:
    s = result.sampled
    if s is None or s.logprobs is None:
        return {}
    sampled_seqs = [seq for seq, tok in zip(sched.seqs, result.tokens) if tok is not None]
    out = {}
    for row, seq in enumerate(sampled_seqs):
        if seq.sampling.logprobs is None:
            continue
        n = seq.sampling.logprobs
        top = tuple(zip(s.top_ids[row][:n], s.top_logprobs[row][:n])) if n else ()
        out[id(seq)] = TokenLogprob(s.token_ids[row], s.logprobs[row], top)
    return out


def _token_output(**fields) -> TokenOutput:
    """A TokenOutput of all its fields, built without the frozen dataclass's __init__: that sets each of its
    11 fields through object.__setattr__, about 1 µs, and a decode step builds one per sequence. TokenOutput
    has no __post_init__, so the object is the same (tests/engine/test_engine_api.py checks the field names)."""
    out = object.__new__(TokenOutput)
    out.__dict__.update(fields)
    return out


def _ended_by_its_token(seq: Sequence) -> bool:
    """EOS or a stop token ended `seq`: its text stays out of the output unless asked for, as in vLLM (the token
    stays in token_ids)."""
    return (seq.is_finished and seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str)
            and not seq.sampling.include_stop_str_in_output)


def _load_tokenizer(config: EngineConfig) -> Tokenizer | None:
    if config.tokenizer is not None:  # asked for by name: its absence is an error, not token-id-only serving
        return Tokenizer(config.tokenizer)
    folder = Path(config.model)
    return Tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
