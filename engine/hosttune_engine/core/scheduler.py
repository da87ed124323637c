"""Continuous batching with chunked prefill, a hard batch limit and preemption (torch-free).

Each step the scheduler spends a token budget: first one token for each running
decode, then prefill chunks, most important first: the next chunk of a running
prefill or the first of a waiting sequence. Beside decodes, prefill tokens are also
limited by a time budget (`max_step_ms`) that a cost model measured at start turns
into chunk sizes (core/step_budget.py), corrected by the real times of the steps it
estimated, so long prompts never stall decoding (under the
priority policy: the decoding of sequences at least as important). When the
KV pool cannot hold a running sequence's next tokens, the least important running
sequence not yet scheduled this step is preempted: its blocks are freed and it goes
back to waiting, to be recomputed later (its full blocks usually survive in the
prefix cache). Under the priority policy a waiting sequence that finds the batch or
the pool full preempts a less important running one, and while a prompt is more
important than some running decodes, those sit out its steps (with a time budget: the
prompt gets the step they would have shared). A step held to a time budget also
stays within the largest step the runner has graphs for (`budgeted_tokens`).

The next step can be scheduled before the last one's tokens are known
(`schedule_ahead`): those tokens stay on the device and feed the next step
there, so the device does not wait for the host between the two.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

from hosttune_engine.core.block_manager import BlockManager
from hosttune_engine.core.scheduler_output import SchedulerOutput  # noqa: F401  (the runner imports it from here)
from hosttune_engine.core.sequence import Sequence, SequenceStatus
from hosttune_engine.core.step_budget import CostCorrection, StepBudget


PENDING_TOKEN = 0  # the id held for a token still on the device; the runner feeds the real one to the model


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    policy: str = "fcfs"  # or "priority": lower value runs first
    max_step_ms: float | None = None  # with a cost model: the time budget of a step that holds decodes (0: auto)


class Scheduler:
    """Decides which sequences run each step and with how many tokens."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, eos_token_ids=(), eos_stop_token_ids=()):
        self.config = config
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)  # the tokenizer's EOS: ends a sequence with no stop_reason
        # the model's other end tokens (generation_config's): as vLLM, they are stop tokens of every request that
        # does not ignore EOS, so the one that ends a sequence is its stop_reason
        self.eos_stop_token_ids = frozenset(eos_stop_token_ids)
        self.waiting: list[Sequence] = []  # sorted by _queue_key
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions = 0
        self.cost_model = None  # a StepCostModel (core/step_cost.py), set once measured
        self.correction = CostCorrection()  # the budgeted steps' real times against the model's
        self.budgeted_tokens: int | None = None  # most tokens of a budgeted step (the runner's mixed graphs)
        self._fills_block: set[int] = set()  # ids of the sequences whose pending token, computed by the step
        # scheduled ahead, completes a block

    # -- queue ------------------------------------------------------------------
    def _queue_key(self, seq: Sequence) -> tuple[int, int]:
        priority = seq.priority if self.config.policy == "priority" else 0
        return (priority, seq.index)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=self._queue_key)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- schedule ---------------------------------------------------------------
    def schedule(self, leave_out: set[int] = frozenset()) -> SchedulerOutput:
        """The next step. `leave_out`: ids of running sequences that sit it out (their last token ends them)."""
        out = SchedulerOutput()
        held = self._held_decodes() | leave_out
        if held or not self._schedule_decodes(out, self.config.max_num_batched_tokens):
            self._schedule_running_decodes(out, held)
        self._schedule_prefills(out, is_admitting=not out.preempted, held=held)  # admitting while preempting would thrash
        if max(out.num_new_tokens, default=1) > 1:  # prefill chunks first; an all-decode step is in order
            order = sorted(range(len(out.seqs)), key=lambda i: out.num_new_tokens[i] == 1)
            out.seqs = [out.seqs[i] for i in order]
            out.num_new_tokens = [out.num_new_tokens[i] for i in order]
            out.estimate_s = self._estimate(out)
        return out

    def _estimate(self, out: SchedulerOutput) -> float | None:
        """The cost model's time of a step of decodes and prefill chunks when a time budget applies, to be
        compared with its real time (`observe_step`)."""
        if self.cost_model is None or self.config.max_step_ms is None or 1 not in out.num_new_tokens:
            return None
        decodes = [s.num_computed_tokens for s, n in zip(out.seqs, out.num_new_tokens) if n == 1]
        return self._budget_of(out, 0.0, decodes).estimate_s()

    def observe_step(self, out: SchedulerOutput, real_s: float) -> None:
        """A collected step's real time (tokens to tokens); steps with an estimate correct the budget."""
        if out.estimate_s is not None:
            self.correction.observe(out.estimate_s, real_s)

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> bool:
        """The steady state in one pass: every running sequence decodes one token and all fit. Otherwise the
        slower path below runs instead."""
        running = self.running
        if len(running) > budget or any(s.num_computed_tokens + 1 != len(s.token_ids) for s in running):
            return False
        if not self.block_manager.can_append(running):
            return False
        self.block_manager.append(running)
        out.seqs.extend(running)
        out.num_new_tokens.extend([1] * len(running))
        return True

    def _held_decodes(self) -> set[int]:
        """Under the priority policy, while a prompt more important than some running decodes waits or is
        being prefilled, those decodes sit the step out (keeping their KV): the prompt's chunk then gets the
        step that they would have shared. The ids of the decodes held."""
        if self.config.policy != "priority" or self.cost_model is None or self.config.max_step_ms is None:
            return set()
        prompts = [s for s in self.running if s.num_uncomputed_tokens > 1] + self.waiting[:1]
        if not prompts:
            return set()
        top = min(s.priority for s in prompts)
        return {id(s) for s in self.running if s.num_uncomputed_tokens == 1 and s.priority > top}

    def _schedule_running_decodes(self, out: SchedulerOutput, held: set[int] = frozenset()) -> None:
        """One token for each running decode not held, in admission order, preempting when the pool is full."""
        budget = self.config.max_num_batched_tokens
        for seq in [s for s in self.running if s.num_uncomputed_tokens == 1 and id(s) not in held]:
            if budget <= 0:
                return
            if seq.status is SequenceStatus.RUNNING and self._allocate_running(seq, 1, out):
                budget -= 1

    def _allocate_running(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        """Give a running `seq` room for `n` tokens this step, preempting the least important sequences not
        yet scheduled (possibly `seq` itself: then False)."""
        while not self.block_manager.can_allocate(seq, n):
            victim = self._pick_victim(out)
            self._preempt(victim, out)
            if victim is seq:
                return False
        self.block_manager.allocate(seq, n)
        out.seqs.append(seq)
        out.num_new_tokens.append(n)
        return True

    def _schedule_prefills(self, out: SchedulerOutput, is_admitting: bool, held: set[int] = frozenset()) -> None:
        """Running prefills' next chunks and waiting sequences' first ones, most important first (running
        ones first among equals), within the token budget and, beside decodes, the step's time budget."""
        if not self.waiting and len(out.seqs) == len(self.running):  # the steady decode: every one is in the step
            return
        in_step = {id(s) for s in out.seqs} | held
        running = sorted((s for s in self.running if id(s) not in in_step), key=self._queue_key)
        preempted = {id(s) for s in out.preempted}
        while True:
            budget = self.config.max_num_batched_tokens - out.num_tokens
            running = [s for s in running if s.status is SequenceStatus.RUNNING]
            waiting = self.waiting[0] if is_admitting and self.waiting else None
            if budget <= 0 or waiting is not None and id(waiting) in preempted:
                waiting = None
            if budget <= 0 or not running and waiting is None:
                return
            if running and (waiting is None or self._queue_key(running[0]) <= self._queue_key(waiting)):
                seq = running.pop(0)
                n = self._chunk(seq, seq.num_computed_tokens, min(seq.num_uncomputed_tokens, budget), out)
                if n == 0:
                    return
                self._allocate_running(seq, n, out)
                is_admitting = is_admitting and not out.preempted
            elif not self._admit(waiting, budget, out):
                return
            preempted = {id(s) for s in out.preempted}

    def _chunk(self, seq: Sequence, context: int, wanted: int, out: SchedulerOutput) -> int:
        """Prefill tokens of `seq` to run this step: `wanted`, or fewer where a time budget applies (then
        also no more than `budgeted_tokens` in the step, when set)."""
        budget = self._step_budget(out, seq)
        if budget is None:
            return wanted
        if self.budgeted_tokens:
            wanted = max(0, min(wanted, self.budgeted_tokens - out.num_tokens))
        return budget.chunk(context, wanted) if wanted else 0

    def _step_budget(self, out: SchedulerOutput, seq: Sequence) -> StepBudget | None:
        """The time budget of the step so far for a chunk of `seq`: only with a cost model, a limit, and
        decodes in the step that the budget protects. Under the priority policy it protects the decodes at
        least as important as `seq`: a prompt more important than every decode in the step is bounded by the
        token budget alone, as with nothing else running (its time to first token is what priority buys)."""
        if self.cost_model is None or self.config.max_step_ms is None:
            return None
        decodes = [s for s, n in zip(out.seqs, out.num_new_tokens) if n == 1]
        if not any(self._queue_key(s)[0] <= self._queue_key(seq)[0] for s in decodes):
            return None
        decodes = [s.num_computed_tokens for s in decodes]
        limit_ms = self.config.max_step_ms
        limit_s = limit_ms / 1e3 if limit_ms else self.cost_model.auto_budget_s(len(decodes), sum(decodes))
        return self._budget_of(out, limit_s / self.correction.scale, decodes)

    def _budget_of(self, out: SchedulerOutput, limit_s: float, decode_contexts: list[int]) -> StepBudget:
        """A budget of `limit_s` holding these decodes and the step's prefill chunks so far."""
        budget = StepBudget(self.cost_model, limit_s, decode_contexts)
        for s, n in zip(out.seqs, out.num_new_tokens):
            if n > 1:
                budget.add(s.num_computed_tokens, n)
        return budget

    def _admit(self, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
        """Start `seq`'s prefill this step; under the priority policy a full batch or pool makes room by
        preempting less important sequences. False when it cannot start now."""
        bm = self.block_manager
        cached = bm.lookup_prefix(seq)
        context = len(cached) * bm.block_size
        n = self._chunk(seq, context, min(seq.num_tokens - context, budget), out)
        while n > 0 and (len(self.running) >= self.config.max_num_seqs or not bm.can_allocate(seq, n, cached)):
            if not self._evict_for(seq, out):
                return False
            cached = bm.lookup_prefix(seq)
            n = min(n, self.config.max_num_batched_tokens - out.num_tokens)
        if n <= 0:
            return False
        bm.allocate(seq, n, cached)
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        self.running.append(seq)
        out.seqs.append(seq)
        out.num_new_tokens.append(n)
        return True

    def _evict_for(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Preempt the least important running sequence if it is less important than `seq` (priority policy
        only), taking it out of this step if it was in it."""
        if self.config.policy != "priority" or not self.running:
            return False
        victim = max(self.running, key=lambda s: (s.priority, s.index))
        if victim.priority <= seq.priority:
            return False
        for i, s in enumerate(out.seqs):
            if s is victim:
                del out.seqs[i], out.num_new_tokens[i]
                break
        self._preempt(victim, out)
        return True

    def schedule_ahead(self, last: SchedulerOutput, sampled: list[bool],
                       decodes_only: bool = False) -> SchedulerOutput | None:
        """The next step, scheduled while `last` is still on the device and the tokens it samples (`sampled`
        per sequence) are unknown; None when it cannot be, and nothing changed then.

        It counts `last` as computed (`postprocess(..., ahead=True)` will not count it again) and holds a
        placeholder for each token `last` samples (`Sequence.has_pending_token`): the runner feeds those
        tokens from the device. Then it schedules as `schedule` does, decodes, prompt chunks and admissions,
        leaving out the sequences that `last`'s token ends by length. One that `last`'s token ends otherwise
        (EOS, a stop string) is finished when it is collected, and its token from this step dropped.
        `decodes_only`: only the steady decode state (every running sequence decoded in `last`, no request
        to admit), where the next step is a decode of every one of them."""
        running = self.running
        if not running or decodes_only and not self._steady_decode(last):
            return None
        ending = set()
        for seq, n, samples in zip(last.seqs, last.num_new_tokens, sampled):
            if seq.status is not SequenceStatus.RUNNING:  # finished since it was scheduled: its token is dropped
                continue
            seq.num_computed_tokens += n
            if samples:
                seq.hold_pending_token(PENDING_TOKEN)
                if self._reaches_length(seq, len(seq.token_ids)):
                    ending.add(id(seq))
        out = self.schedule(leave_out=ending)
        bs = self.block_manager.block_size
        self._fills_block = {id(s) for s in out.seqs if s.has_pending_token and (s.num_computed_tokens + 1) % bs == 0}
        return out

    def _steady_decode(self, last: SchedulerOutput) -> bool:
        """Every running sequence decoded in `last`, and no waiting one can join (under the priority policy
        a waiting one may take a running one's place)."""
        if len(self.running) > self.config.max_num_batched_tokens or self._could_admit():
            return False
        if self.waiting and self.config.policy == "priority":
            return False
        in_last = {id(s) for s in last.seqs}
        return all(id(s) in in_last and s.num_computed_tokens + 1 == len(s.token_ids) for s in self.running)

    def _could_admit(self) -> bool:
        return bool(self.waiting) and len(self.running) < self.config.max_num_seqs

    def _reaches_length(self, seq: Sequence, num_tokens: int) -> bool:
        return (num_tokens - seq.num_prompt_tokens >= seq.sampling.max_tokens
                or num_tokens >= self.config.max_model_len)

    def _pick_victim(self, out: SchedulerOutput) -> Sequence:
        """The least important running sequence not yet scheduled this step."""
        in_step = {id(s) for s in out.seqs}
        candidates = [s for s in self.running if id(s) not in in_step]
        if self.config.policy == "priority":
            return max(candidates, key=lambda s: (s.priority, s.index))
        return candidates[-1]

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.add(seq)

    # -- after the model ran -----------------------------------------------------
    def postprocess(self, out: SchedulerOutput, sampled: list[int | None], ahead: bool = False) -> list[Sequence]:
        """Advance computed counts, append sampled tokens, finish on token-level stops.

        `sampled[i]` is the new token of `out.seqs[i]`, or None for a prefill chunk
        that did not reach the end of its prompt. Returns the sequences that got
        a token this step (finished ones included). A sequence that finished after
        this step was scheduled (the engine finds stop strings one step late) is
        left as it is: its token is dropped. `ahead`: the next step was scheduled
        ahead of this one's tokens, which counted this step's computed tokens.
        """
        advanced = []
        finished = SequenceStatus.FINISHED
        fills_block, self._fills_block = self._fills_block, set()  # from the step scheduled ahead of these tokens
        for seq, n, token in zip(out.seqs, out.num_new_tokens, sampled):
            if seq.status is finished:
                continue
            if not ahead:
                seq.num_computed_tokens += n
            if token is None:
                continue
            if seq.has_pending_token:
                seq.set_pending_token(token)
                if id(seq) in fills_block:  # the step ahead computes this token: the block it ends is known now
                    self.block_manager.register_full_blocks(seq, seq.num_computed_tokens + 1)
            else:
                seq.append_token(token)
            advanced.append(seq)
            reason = self._token_stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason, stop_reason=token if self._is_stop_token(seq, token) else None)
        return advanced

    def _token_stop_reason(self, seq: Sequence, token: int) -> str | None:
        if self._is_eos(seq, token) or self._is_stop_token(seq, token):
            return "stop"
        return "length" if self._reaches_length(seq, len(seq.token_ids)) else None

    def _is_eos(self, seq: Sequence, token: int) -> bool:
        return token in self.eos_token_ids and not seq.sampling.ignore_eos

    def _is_stop_token(self, seq: Sequence, token: int) -> bool:
        """A stop token, the sequence's stop_reason: as vLLM, EOS is checked first, so one the request lists among
        its stop_token_ids still ends it with none."""
        params = seq.sampling
        if self._is_eos(seq, token):
            return False
        return token in params.stop_token_ids or (token in self.eos_stop_token_ids and not params.ignore_eos)

    def finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        """End `seq` now (stop, length or abort) and return its blocks."""
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
