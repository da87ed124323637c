"""Top-k / top-p sampling by the rejection race (kernels.race) against the sort it replaces.

On a machine without a GPU the kernel runs under the Triton interpreter (conftest)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.race import race_sample, race_sample_ref
from hosttune_engine.layers.sampler import SORT_TOP_K_AND_P_BELOW, Sampler, SamplingBatch, sort_sample
from hosttune_engine.sampling import SamplingParams

from .conftest import DEVICE

VOCAB = 300  # not a power of two: the last block of a row is partly masked


def _rows(n: int, seed: int, vocab: int = VOCAB):
    """Random logits, noise and per-row settings: top-k, top-p, both (every 5th row) or neither."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * 3
    noise = torch.empty(n, vocab).exponential_(generator=gen)
    temperature = torch.tensor([0.5, 1.0, 1.7, 1e-7])[torch.arange(n) % 4]
    top_p = torch.tensor([1.0, 0.05, 0.5, 0.9, 0.999, 1.0])[torch.arange(n) % 6]
    top_k = torch.tensor([1, 3, 50, vocab, 10**6])[torch.arange(n) % 5]
    top_k = torch.where((top_p < 1) & (torch.arange(n) % 5 != 2), vocab, top_k)
    return [t.to(DEVICE) for t in (logits, noise, temperature, top_k, top_p)]


def test_reference_rounds_pick_what_the_sort_picks():
    args = _rows(240, seed=1)
    assert torch.equal(race_sample_ref(*args), sort_sample(*args))


def test_kernel_matches_the_reference_across_blocks():
    args = _rows(48, seed=2)
    assert torch.equal(race_sample(*args, config=(64, 4)), race_sample_ref(*args))
    assert torch.equal(race_sample(*args), sort_sample(*args))  # one block holds the row


def test_ties_at_the_cut_keep_the_lowest_ids():
    """Eight equal tokens: top-p 0.3 keeps those whose mass before is <= 0.3 (ids 0-2), top-k 5 ids 0-4."""
    n = 120
    logits = torch.zeros(n, 8, device=DEVICE)
    noise = torch.empty(n, 8).exponential_(generator=torch.Generator().manual_seed(3)).to(DEVICE)
    temperature = torch.ones(n, device=DEVICE)
    for top_k, top_p, kept in ((8, 0.3, {0, 1, 2}), (5, 1.0, {0, 1, 2, 3, 4})):
        settings = (temperature, torch.full((n,), top_k, device=DEVICE), torch.full((n,), top_p, device=DEVICE))
        ref = race_sample_ref(logits, noise, *settings)
        assert set(ref.tolist()) == kept
        assert torch.equal(race_sample(logits, noise, *settings, config=(4, 4)), ref)
    flat = torch.ones(2, 8, device=DEVICE)  # equal scores too: the race goes to the lowest id, as argmax does
    settings = (temperature[:2], torch.tensor([8, 8], device=DEVICE), torch.tensor([1.0, 0.5], device=DEVICE))
    assert race_sample(logits[:2], flat, *settings, config=(4, 4)).tolist() == [0, 0]
    assert race_sample_ref(logits[:2], flat, *settings).tolist() == [0, 0]


def test_sampled_frequencies_follow_the_renormalized_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    batch = SamplingBatch.build([SamplingParams(temperature=1.0, top_p=0.7)] * n, [None] * n, 4, DEVICE)
    tokens = Sampler().sample(probs.log().repeat(n, 1).to(DEVICE), batch).to_host().token_ids
    freq = torch.bincount(torch.tensor(tokens), minlength=4).float() / n
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.5 / 0.8) < 0.03


@pytest.mark.parametrize("probs, top_k, top_p, kept", [
    ([0.5, 0.3, 0.15, 0.05], 2, 0.6, {0}),  # top 2 renormalized: 0.625, 0.375 (over the whole row: {0, 1})
    ([0.4, 0.2, 0.2, 0.2], 3, 0.55, {0, 1}),  # ties at the k-th: the top 3's mass is 0.8, so 0.44 fits 0.4
    ([0.4, 0.2, 0.2, 0.2], 3, 0.8, {0, 1, 2}),  # 0.6 before id 2 fits 0.64; id 3 is past the top 3
])
def test_a_row_with_top_k_and_top_p_takes_its_nucleus_over_its_top_k(probs, top_k, top_p, kept):
    n = 100
    logits = torch.tensor(probs).log().repeat(n, 1).to(DEVICE)
    noise = torch.empty(n, 4).exponential_(generator=torch.Generator().manual_seed(6)).to(DEVICE)
    settings = (torch.ones(n, device=DEVICE), torch.full((n,), top_k, device=DEVICE),
                torch.full((n,), top_p, device=DEVICE))
    assert set(race_sample(logits, noise, *settings, config=(2, 4)).tolist()) == kept
    assert set(race_sample_ref(logits, noise, *settings).tolist()) == kept
    batch = SamplingBatch.build([SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)] * n, [None] * n, 4, DEVICE)
    assert set(Sampler().sample(logits, batch).to_host().token_ids) == kept


def test_small_batches_with_top_k_and_top_p_sort_and_pick_the_race_token():
    """Below SORT_TOP_K_AND_P_BELOW rows the sampler sorts; with the same noise it picks what the race picks."""
    args = _rows(SORT_TOP_K_AND_P_BELOW - 1, seed=7)
    logits, _, temperature, top_k, top_p = args
    params = [SamplingParams(temperature=float(t), top_k=int(k) if k < VOCAB else 0, top_p=float(p))
              for t, k, p in zip(temperature, top_k, top_p)]
    batch = SamplingBatch.build(params, [None] * len(params), VOCAB, DEVICE)
    assert batch.top_k_and_p
    torch.manual_seed(8)
    tokens = Sampler().sample(logits, batch).tokens
    torch.manual_seed(8)  # the sampler's noise comes first from the global generator
    noise = torch.empty_like(logits).exponential_()
    assert torch.equal(tokens, race_sample_ref(logits, noise, temperature, top_k, top_p))


def test_seeded_rows_repeat_whatever_the_batch():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4)).to(DEVICE)

    def draw(other: SamplingParams) -> int:
        gen = torch.Generator(device=DEVICE).manual_seed(11)
        params = [other, SamplingParams(temperature=0.9, top_p=0.8, seed=11), other]
        batch = SamplingBatch.build(params, [None, gen, None], VOCAB, DEVICE)
        return Sampler().sample(logits, batch).to_host().token_ids[1]

    assert draw(SamplingParams(temperature=0)) == draw(SamplingParams(temperature=2.0, top_k=5))


def test_rows_that_are_not_finite_end_with_an_id_in_range():
    """A loop that never accepted would hang the engine: NaN and infinite logits must still end it."""
    logits = torch.randn(4, 40)
    logits[0] = float("-inf")
    logits[1, 3] = float("inf")
    logits[2, ::2] = float("nan")
    logits[3] = float("nan")
    logits, noise = logits.to(DEVICE), torch.ones(4, 40, device=DEVICE)
    settings = (torch.ones(4, device=DEVICE), torch.full((4,), 5, device=DEVICE), torch.full((4,), 0.3, device=DEVICE))
    tokens = race_sample(logits, noise, *settings, config=(16, 4)).tolist()
    assert all(0 <= t < 40 for t in tokens)
    assert tokens[2] % 2 == 1  # the NaN logits take no part in the race


def test_bad_inputs_are_named():
    logits, noise, temperature, top_k, top_p = _rows(4, seed=5)
    with pytest.raises(KernelInputError, match="noise"):
        race_sample(logits, noise[:, :10], temperature, top_k, top_p)
    with pytest.raises(KernelInputError, match="one value per row"):
        race_sample(logits, noise, temperature[:2], top_k, top_p)


COMPILE_FOR_HOPPER = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from hosttune_engine.kernels.race import _race_kernel, launch_config
    sig = {"logits_ptr": "*fp32", "noise_ptr": "*fp32", "temp_ptr": "*fp32", "top_k_ptr": "*i64",
           "top_p_ptr": "*fp32", "out_ptr": "*i64", "stride_l": "i32", "stride_e": "i32", "n_cols": "i32",
           "MIN_T": "constexpr", "BLOCK": "constexpr"}
    for rows in (1, 256):
        block, warps = launch_config(rows)
        src = ASTSource(_race_kernel, sig, constexprs={"MIN_T": 1e-5, "BLOCK": block})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        print(block, warps, sorted(kernel.asm))
""")


def test_kernel_compiles_for_hopper_without_a_gpu():
    """The interpreter runs Python, not Triton's compiler: what only the compiler rejects (a constexpr
    assigned twice in an unrolled loop, say) would first fail on the GPU. Compiling needs no GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("cubin") == 2
