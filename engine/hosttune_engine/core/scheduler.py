"""Continuous batching with chunked prefill, a hard batch limit and preemption (torch-free).

Each step the scheduler spends a token budget: first on running sequences (one
token for each decode, the next chunk for each unfinished prefill), then on
waiting ones in priority order. When the KV pool cannot hold a running
sequence's next tokens, the least important running sequence not yet scheduled
this step is preempted: its blocks are freed and it goes back to waiting, to be
recomputed later (its full blocks usually survive in the prefix cache).

In the steady decode state the next step can be scheduled before the last
one's tokens are known (`schedule_ahead`): those tokens stay on the device and
feed the next step there, so the device never waits for the host.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from hosttune_engine.cache.block_manager import BlockManager
from hosttune_engine.core.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    policy: str = "fcfs"  # or "priority": lower value runs first


@dataclass
class SchedulerOutput:
    """One step's work. Prefill chunks (more than one new token) come before decodes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_prefill_seqs(self) -> int:
        return sum(1 for n in self.num_new_tokens if n > 1)

    def sample_mask(self) -> list[bool]:
        """Which sequences reach their last token this step, so get a sampled token."""
        return [s.num_computed_tokens + n == len(s.token_ids) for s, n in zip(self.seqs, self.num_new_tokens)]


class Scheduler:
    """Decides which sequences run each step and with how many tokens."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, eos_token_ids=()):
        self.config = config
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: list[Sequence] = []  # sorted by _queue_key
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions = 0
        self._fills_block: set[int] = set()  # ids of sequences whose pending token completes a block (ahead)

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
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # admitting while preempting would thrash
            self._schedule_waiting(out, budget)
        if max(out.num_new_tokens, default=1) > 1:  # prefill chunks first; an all-decode step is in order
            order = sorted(range(len(out.seqs)), key=lambda i: out.num_new_tokens[i] == 1)
            out.seqs = [out.seqs[i] for i in order]
            out.num_new_tokens = [out.num_new_tokens[i] for i in order]
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        if self._schedule_decodes(out, budget):
            return budget - len(out.seqs)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_allocate(seq, n):
                victim = self._pick_victim(i)
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                self.block_manager.allocate(seq, n)
                out.seqs.append(seq)
                out.num_new_tokens.append(n)
                budget -= n
                i += 1
        return budget

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> bool:
        """The steady state in one pass: every running sequence decodes one token and all fit. Then the
        loop above would schedule them all in order without preempting; otherwise it runs instead."""
        running = self.running
        if len(running) > budget or any(s.num_computed_tokens + 1 != len(s.token_ids) for s in running):
            return False
        if not self.block_manager.can_append(running):
            return False
        self.block_manager.append(running)
        out.seqs.extend(running)
        out.num_new_tokens.extend([1] * len(running))
        return True

    def schedule_ahead(self, last: SchedulerOutput) -> SchedulerOutput | None:
        """The next decode step, scheduled while `last` (a decode step of every running sequence) is still on
        the device and its tokens unknown; None when that cannot be decided yet, and nothing changed then.

        It counts `last` as computed (`postprocess(..., ahead=True)` will not count it again) and gives every
        running sequence one more token, except those that `last`'s token ends by length. One that `last`'s
        token ends otherwise (EOS, a stop string) is finished when it is collected, and its token from this
        step dropped. Waiting requests that could be admitted, and a step that would have to preempt, are
        left to `schedule`, after `last` is collected."""
        running = self.running
        if not running or len(running) > self.config.max_num_batched_tokens or self._could_admit():
            return None
        in_last = {id(s) for s in last.seqs}
        for seq in running:  # a plain loop: this runs every decode step, for every sequence
            if id(seq) not in in_last or seq.num_computed_tokens + 1 != len(seq.token_ids):
                return None
        ahead = []
        for seq in running:
            seq.num_computed_tokens += 1
            if not self._reaches_length(seq, len(seq.token_ids) + 1):
                ahead.append(seq)
        if not ahead or not self.block_manager.can_append(ahead):
            for seq in running:
                seq.num_computed_tokens -= 1
            return None
        bs = self.block_manager.block_size
        self._fills_block = {id(s) for s in ahead if (s.num_computed_tokens + 1) % bs == 0}
        self.block_manager.append(ahead)  # registers no block that holds a pending token: see postprocess
        return SchedulerOutput(seqs=ahead, num_new_tokens=[1] * len(ahead))

    def _could_admit(self) -> bool:
        return bool(self.waiting) and len(self.running) < self.config.max_num_seqs

    def _reaches_length(self, seq: Sequence, num_tokens: int) -> bool:
        return (num_tokens - seq.num_prompt_tokens >= seq.sampling.max_tokens
                or num_tokens >= self.config.max_model_len)

    def _pick_victim(self, first: int) -> Sequence:
        """The least important running sequence not yet scheduled this step."""
        candidates = self.running[first:]
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

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = bm.lookup_prefix(seq)
            n = min(seq.num_tokens - len(cached) * bm.block_size, budget)
            if not bm.can_allocate(seq, n, cached):
                break
            bm.allocate(seq, n, cached)
            self.waiting.pop(0)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n

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
        fills_block, self._fills_block = self._fills_block, set()  # filled by schedule_ahead just before
        for seq, n, token in zip(out.seqs, out.num_new_tokens, sampled):
            if seq.status is finished:
                continue
            if not ahead:
                seq.num_computed_tokens += n
            if token is None:
                continue
            seq.append_token(token)
            if id(seq) in fills_block:  # the step ahead computes this token: its block is full and known now
                self.block_manager.register_full_blocks(seq, seq.num_computed_tokens + 1)
            advanced.append(seq)
            reason = self._token_stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason, stop_reason=token if reason == "stop" else None)
        return advanced

    def _token_stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.sampling
        if token in params.stop_token_ids:
            return "stop"
        if token in self.eos_token_ids and not params.ignore_eos:
            return "stop"
        return "length" if self._reaches_length(seq, len(seq.token_ids)) else None

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
