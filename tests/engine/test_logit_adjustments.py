"""Penalties, min_p, min_tokens and logit_bias on small logits against a row-by-row reference (vLLM's rules)."""

from collections import Counter

import pytest
import torch

from hosttune_engine.errors import ConfigError
from hosttune_engine.layers.logit_adjustments import LogitAdjustments, TokenHistory, adjust_logits
from hosttune_engine.layers.sampler import Sampler, SamplingBatch
from hosttune_engine.sampling import SamplingParams

V = 12
EOS = (11,)


def _reference(row: list[float], p: SamplingParams, h: TokenHistory) -> list[float]:
    """One row the plain way, in vLLM's order."""
    row = list(row)
    for t, b in p.logit_bias:
        row[t] += b
    if h.num_output_tokens < p.min_tokens:
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else set(EOS)):
            row[t] = float("-inf")
    seen = set(h.prompt_ids) | set(h.output_counts)
    for t in seen:
        row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t, c in h.output_counts.items():
        row[t] -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    if p.min_p and not p.is_greedy:
        probs = torch.tensor(row).div(p.temperature).softmax(-1).tolist()
        row = [x if q >= p.min_p * max(probs) else float("-inf") for x, q in zip(row, probs)]
    return row


def _history(prompt, output) -> TokenHistory:
    return TokenHistory(tuple(set(prompt)), Counter(output), len(output))


CASES = [
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6, temperature=0),
    SamplingParams(presence_penalty=1.5),
    SamplingParams(frequency_penalty=-0.8, presence_penalty=0.3, temperature=0),
    SamplingParams(min_p=0.2, temperature=0.7),
    SamplingParams(min_p=0.5, temperature=0),  # greedy: min_p leaves it as it is
    SamplingParams(min_tokens=3, stop_token_ids=(4,)),
    SamplingParams(min_tokens=3, stop_token_ids=(4,), ignore_eos=True),
    SamplingParams(min_tokens=2),  # two tokens out already: nothing held back
    SamplingParams(logit_bias={"3": 250.0, "5": -2.5}),
    SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, logit_bias={"1": 1.0}, min_p=0.1),
]


@pytest.mark.parametrize("params", CASES)
def test_each_setting_matches_the_row_by_row_reference(params):
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 3
    hist = [_history([0, 1, 2], [5, 5, 7]), _history([2, 3], [1, 8]), None]
    plain = SamplingParams()
    adj = LogitAdjustments.build([params, params, plain], hist, EOS, V, "cpu")
    got = adjust_logits(logits, adj)
    for r in range(2):
        assert got[r].tolist() == pytest.approx(_reference(logits[r].tolist(), params, hist[r]))
    assert torch.equal(got[2], logits[2])  # a row that sets nothing is left as it is


def test_logit_bias_is_clamped_to_100():
    assert SamplingParams(logit_bias={"7": 250, "2": -1e9}).logit_bias == ((7, 100.0), (2, -100.0))


def test_a_batch_that_sets_nothing_builds_no_adjustments():
    batch = SamplingBatch.build([SamplingParams(), SamplingParams(temperature=0)], [None, None], V, "cpu")
    assert batch.adjustments is None


def test_greedy_honours_bias_and_penalties_and_logprobs_stay_the_models():
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0]])
    params = [SamplingParams(temperature=0, logit_bias={"2": 100})]
    out = Sampler()(logits, SamplingBatch.build(params, [None], 4, "cpu"))
    assert out.token_ids == [2]
    params = [SamplingParams(temperature=0, frequency_penalty=2.0, logprobs=0)]
    out = Sampler()(logits, SamplingBatch.build(params, [None], 4, "cpu", [_history([], [0, 0, 0])]))
    assert out.token_ids == [1]
    assert out.logprobs[0] == pytest.approx(logits.log_softmax(-1)[0, 1].item())


def test_min_p_keeps_a_seeded_row_within_the_kept_tokens():
    logits = torch.tensor([[3.0, 2.9, -4.0, -5.0]]).repeat(64, 1)
    params = [SamplingParams(min_p=0.5, seed=s) for s in range(64)]
    gens = [torch.Generator().manual_seed(s) for s in range(64)]
    out = Sampler()(logits, SamplingBatch.build(params, gens, 4, "cpu"))
    assert set(out.token_ids) == {0, 1}


@pytest.mark.parametrize("kwargs, message", [
    (dict(presence_penalty=2.5), "presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=-3), "frequency_penalty must be in [-2, 2]"),
    (dict(repetition_penalty=0), "repetition_penalty must be greater than zero"),
    (dict(min_p=1.5), "min_p must be in [0, 1]"),
    (dict(min_tokens=-1), "min_tokens must be greater than or equal to 0"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens must be less than or equal to max_tokens=10"),
])
def test_out_of_range_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**kwargs)


def test_a_sequence_with_a_penalty_counts_its_output_tokens_a_pending_one_once_known():
    from hosttune_engine.core.sequence import Sequence

    seq = Sequence("r", [3, 3, 4], SamplingParams(presence_penalty=1.0))
    seq.append_token(5)
    seq.hold_pending_token(0)
    assert seq.output_counts == Counter({5: 1}) and sorted(seq.prompt_ids) == [3, 4]
    seq.set_pending_token(5)
    assert seq.output_counts == Counter({5: 2})
    assert Sequence("q", [1], SamplingParams()).output_counts is None  # nothing kept where nothing reads it
