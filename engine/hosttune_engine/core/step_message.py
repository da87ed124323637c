"""What rank 0 tells the other ranks about each step: one message, broadcast before the step runs.

The other ranks hold no scheduler: a message carries, per scheduled sequence, what their model runner
reads (token ids to compute, positions, block table), and which path rank 0 takes (decode graph, prefill
graph, mixed graphs, eager), so every rank launches the same kernels and collectives in the same order.
A rank keeps a mirror `Sequence` per request (`Mirrors`) so the decode graphs' block-table rows are reused
as on rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.sampling import SamplingParams


class StepKind(Enum):
    DECODE_GRAPH = "decode_graph"  # DecodeGraphs.run
    PREFILL_GRAPH = "prefill_graph"  # PrefillGraphs.run
    MIXED_GRAPH = "mixed_graph"  # MixedGraphs.run; logits of the sampled rows when `sample`
    EAGER = "eager"  # the packed step; logits of the sampled rows when `sample`
    ALL_LOGITS = "all_logits"  # the packed step, logits of every row (ModelRunner.prefill_logits)


@dataclass(frozen=True)
class SeqState:
    request_id: str
    num_computed_tokens: int
    num_tokens: int
    new_token_ids: tuple[int, ...]  # token_ids[computed : computed + n]; empty when fed from the device
    block_table: tuple[int, ...]
    num_preemptions: int


@dataclass(frozen=True)
class StepMessage:
    kind: StepKind
    seqs: tuple[SeqState, ...]
    num_new_tokens: tuple[int, ...]
    feed: tuple[int, ...] | None = None  # decode graph: each row's row in the previous step
    sample: bool = False
    released: tuple[str, ...] = ()  # requests finished since the last message


def step_message(kind: StepKind, sched: SchedulerOutput, feed: list[int] | None = None, sample: bool = False,
                 released: tuple[str, ...] = ()) -> StepMessage:
    states = tuple(
        SeqState(s.request_id, s.num_computed_tokens, s.num_tokens,
                 () if feed is not None else tuple(s.token_ids[s.num_computed_tokens:s.num_computed_tokens + n]),
                 tuple(s.block_table), s.num_preemptions)
        for s, n in zip(sched.seqs, sched.num_new_tokens))
    return StepMessage(kind, states, tuple(sched.num_new_tokens), None if feed is None else tuple(feed), sample,
                       released)


class Mirrors:
    """A rank's copies of rank 0's running sequences, as far as its model runner reads them."""

    def __init__(self):
        self.seqs: dict[str, Sequence] = {}

    def update(self, message: StepMessage) -> SchedulerOutput:
        for request_id in message.released:
            self.seqs.pop(request_id, None)
        return SchedulerOutput(seqs=[self._mirror(s) for s in message.seqs], num_new_tokens=list(message.num_new_tokens))

    def _mirror(self, state: SeqState) -> Sequence:
        seq = self.seqs.get(state.request_id)
        if seq is None:
            seq = self.seqs[state.request_id] = Sequence(state.request_id, [], SamplingParams())
        ids, start = seq.token_ids, state.num_computed_tokens
        del ids[state.num_tokens:]
        ids.extend([0] * (state.num_tokens - len(ids)))
        ids[start:start + len(state.new_token_ids)] = state.new_token_ids
        seq.num_computed_tokens, seq.num_preemptions = start, state.num_preemptions
        seq.block_table = list(state.block_table)
        return seq
