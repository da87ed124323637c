"""The time budget of one step being scheduled (torch-free).

A step that holds decodes admits prefill tokens only while the cost model's estimate of
the step stays under `budget_s`, so a long prompt is chunked to fit and the decodes'
inter-token latency stays flat. The step's first prefill always gets `min_chunk`
tokens, so prompts progress even when the decodes alone fill the budget. A step without
decodes has no time limit: the token budget alone bounds it, as offline batches want.
"""

from __future__ import annotations

MIN_CHUNK = 64  # tokens: the first prefill's share of a step whose decodes fill the budget


class StepBudget:
    """What a step holds so far, for a cost model with `step_seconds` and `max_chunk`
    (core/step_cost.py)."""

    def __init__(self, cost_model, budget_s: float, decode_contexts: list[int], min_chunk: int = MIN_CHUNK):
        self.cost_model = cost_model
        self.budget_s = budget_s
        self.num_tokens = len(decode_contexts)
        self.decode_context = sum(decode_contexts)
        self.prefill_pairs = 0
        self.min_chunk = min_chunk
        self.num_chunks = 0

    def chunk(self, context: int, wanted: int) -> int:
        """Tokens of a prefill at `context` (tokens before the chunk) to run, at most `wanted`."""
        fit = self.cost_model.max_chunk(self.budget_s, self.num_tokens, self.decode_context,
                                        self.prefill_pairs, context, wanted)
        if self.num_chunks == 0:
            fit = max(fit, min(self.min_chunk, wanted))
        return fit

    def add(self, context: int, num_tokens: int) -> None:
        self.num_tokens += num_tokens
        self.prefill_pairs += num_tokens * context
        self.num_chunks += 1

    def estimate_s(self) -> float:
        return self.cost_model.step_seconds(self.num_tokens, self.decode_context, self.prefill_pairs)


class CostCorrection:
    """How the budgeted steps' real times compare with the cost model's estimates, so the budget holds for
    the time decodes see.

    A step's real time, from the tokens of the step before to its own, also holds what the estimate
    leaves out: the host's work between two steps that are not launched ahead (collecting, scheduling,
    packing), and any error of the model (a shape measured once at start, a device warmer or busier than
    then). `scale` is a moving average of real over estimated time; the scheduler divides the budget by
    it. With a constant host time h per step, the estimates settle at the budget minus h."""

    WEIGHT = 0.1  # of each new step in the average
    LIMITS = (0.25, 4.0)  # the scale never leaves these
    MIN_ESTIMATE_S = 1e-3  # shorter estimates are mostly noise

    def __init__(self) -> None:
        self.scale = 1.0
        self.num_steps = 0

    def observe(self, estimate_s: float, real_s: float) -> None:
        if estimate_s < self.MIN_ESTIMATE_S or real_s <= 0:
            return
        ratio = min(max(real_s / estimate_s, self.LIMITS[0]), self.LIMITS[1])
        self.scale += self.WEIGHT * (ratio - self.scale)
        self.num_steps += 1
