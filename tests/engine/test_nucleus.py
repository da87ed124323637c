"""Top-k and top-p without a sort: the same tokens as a stable descending sort keeps, ties included."""

import pytest
import torch

from hosttune_engine.kernels.nucleus import nucleus_threshold, nucleus_threshold_ref
from hosttune_engine.layers.sampler import filter_top_k_top_p, top_k_mask, top_p_mask

from .conftest import DEVICE

TOP_P = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]


def sorted_keep(scores: torch.Tensor, keep_sorted) -> torch.Tensor:
    """Apply `keep_sorted(sorted scores) -> bool [N, V]` in the order of a stable descending sort."""
    values, order = scores.sort(dim=-1, descending=True, stable=True)
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order, keep_sorted(values))


def exact_probs(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows of multiples of 1/256 with many ties: every sum of them is exact in fp32."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randint(0, 6, (rows, vocab), generator=gen).float()
    weights[:, 0] += 1  # no empty row
    units = (weights / weights.sum(-1, keepdim=True) * 256).floor()
    units[:, 0] += 256 - units.sum(-1)
    return (units / 256).to(DEVICE)


def test_threshold_kernel_matches_the_torch_bisection():
    gen = torch.Generator().manual_seed(0)
    probs = torch.randn(len(TOP_P), 3000, generator=gen).mul(3).softmax(-1).to(DEVICE)
    top_p = torch.tensor(TOP_P, device=DEVICE)
    thr, above = nucleus_threshold(probs, top_p)
    ref_thr, ref_above = nucleus_threshold_ref(probs, top_p)
    assert torch.equal(thr, ref_thr)
    torch.testing.assert_close(above, ref_above, atol=1e-6, rtol=0)
    assert thr[-1] == 0 and (thr[:-1] > 0).all()  # top_p 1 keeps everything
    mass = lambda t: torch.where(probs > t[:, None], probs, 0.0).sum(-1)  # noqa: E731
    assert (mass(thr) <= top_p).all()  # the threshold's mass above fits...
    below = (thr.view(torch.int32) - 1).view(torch.float32)
    assert (mass(below)[:-1] > top_p[:-1]).all()  # ...and the next smaller number's does not


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_top_p_keeps_what_a_stable_sort_keeps(seed):
    probs = exact_probs(len(TOP_P), 40, seed)
    top_p = torch.tensor(TOP_P, device=DEVICE)
    want = sorted_keep(probs, lambda v: v.cumsum(-1) - v <= top_p[:, None])
    got = top_p_mask(probs, top_p)
    assert torch.equal(got, want)
    assert got.sum(-1)[0] >= 1 and got[-1].all()  # top_p 0 keeps the most likely token; 1 keeps all


def test_top_p_at_exact_boundaries_keeps_the_tied_tokens_that_fit():
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25, 0.0], [0.5, 0.125, 0.125, 0.125, 0.125]], device=DEVICE)
    for p, kept in ((0.25, [2, 1]), (0.5, [3, 2]), (0.625, [3, 3]), (0.74, [3, 3]), (0.75, [4, 4]), (0.9, [4, 5])):
        got = top_p_mask(probs, torch.tensor([p, p], device=DEVICE))
        assert got.sum(-1).tolist() == kept, p
        assert [row.nonzero()[:, 0].tolist() for row in got] == [list(range(k)) for k in kept]  # lowest ids


@pytest.mark.parametrize("seed", [4, 5])
def test_top_k_keeps_what_a_stable_sort_keeps(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 5, (6, 50), generator=gen).float().to(DEVICE)  # many ties
    top_k = torch.tensor([1, 2, 7, 13, 50, 50], device=DEVICE)  # the last: top-k off (the vocab size)
    want = sorted_keep(logits, lambda v: torch.arange(50, device=DEVICE)[None, :] < top_k[:, None])
    assert torch.equal(top_k_mask(logits, top_k, max_top_k=13), want)
    assert torch.equal(top_k_mask(logits, top_k, max_top_k=50), want)


def test_filter_applies_top_p_to_what_top_k_left():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]], device=DEVICE))
    out = filter_top_k_top_p(logits, torch.tensor([3], device=DEVICE), torch.tensor([0.5], device=DEVICE), 3)
    # top-3 renormalized: 0.444, 0.333, 0.222; mass before the second is 0.444 <= 0.5, before the third 0.778
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
