"""KV pool sizing and binding; sampler filters and the exponential race."""

import math

import pytest
import torch

from hosttune_engine.cache.kv_pool import KVCacheShape, KVPool, check_free_memory, num_blocks_for_memory
from hosttune_engine.errors import ConfigError
from hosttune_engine.layers.attention import Attention
from hosttune_engine.layers.sampler import Sampler, SamplingBatch, filter_top_k_top_p, seeded_generator
from hosttune_engine.sampling import SamplingParams

QWEN7B_KV = KVCacheShape(num_layers=28, block_size=16, num_kv_heads=4, head_dim=128, dtype_bytes=2)


def test_bytes_per_block_and_sizing():
    assert QWEN7B_KV.bytes_per_block == 2 * 28 * 16 * 4 * 128 * 2  # 917,504 bytes: 57 KiB per token
    gib = 2**30
    blocks = num_blocks_for_memory(100 * gib, 0.9, 15 * gib, 2 * gib, QWEN7B_KV)
    assert blocks == (90 * gib - 15 * gib - 2 * gib) // QWEN7B_KV.bytes_per_block
    assert num_blocks_for_memory(gib, 0.9, 0, 2 * gib, QWEN7B_KV) == 0
    # four engines sharing a GPU, a quarter each: the same pool whichever starts first
    quarter = num_blocks_for_memory(100 * gib, 0.225, 15 * gib, 2 * gib, QWEN7B_KV)
    assert quarter == (int(22.5 * gib) - 17 * gib) // QWEN7B_KV.bytes_per_block


def test_a_pool_that_other_processes_leave_no_room_for_is_refused_in_one_line():
    gib = 2**30
    check_free_memory(6 * gib, 6 * gib, 100 * gib, 0.225)
    with pytest.raises(ConfigError, match=r"^gpu_memory_utilization=0.225 of this GPU's 100.0 GiB asks for 6.0 GiB "
                                          r"more, but only 5.0 GiB is free"):
        check_free_memory(6 * gib, 5 * gib, 100 * gib, 0.225)


def test_pool_binds_distinct_views_per_layer():
    shape = KVCacheShape(num_layers=3, block_size=4, num_kv_heads=2, head_dim=16, dtype_bytes=4)
    model = torch.nn.ModuleList(Attention(2, 2, 16, 0.25) for _ in range(3))
    pool = KVPool(shape, num_blocks=5, device=torch.device("cpu"), dtype=torch.float32)
    pool.bind(model)
    assert model[0].k_cache.shape == (5, 4, 2, 16) and model[0].k_cache.is_contiguous()
    model[1].v_cache.fill_(1.0)
    assert pool.cache[1, 1].sum() == model[1].v_cache.numel() and pool.cache[1, 0].sum() == 0


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    out = filter_top_k_top_p(logits, torch.tensor([2, 4]), None)
    assert torch.isinf(out[0, 2:]).all() and torch.isfinite(out[0, :2]).all() and torch.isfinite(out[1]).all()
    out = filter_top_k_top_p(logits, None, torch.tensor([0.7, 0.6]))
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()  # 0.5 + 0.3 covers 0.7
    assert torch.isfinite(out[1, :3]).sum() == 3 and torch.isinf(out[1, 3])


def test_sampling_follows_the_distribution_and_seeds_repeat():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    logits = probs.clamp_min(1e-30).log().repeat(4000, 1)
    params = [SamplingParams(temperature=1.0)] * 4000
    batch = SamplingBatch.build(params, [None] * 4000, 4, "cpu")
    tokens = torch.tensor(Sampler()(logits, batch).token_ids)
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert (freq - probs).abs().max() < 0.03 and freq[3] == 0

    def seeded(seed):
        gen = torch.Generator().manual_seed(seed)
        b = SamplingBatch.build([SamplingParams(temperature=1.0, seed=seed)], [gen], 4, "cpu")
        return [Sampler()(logits[:1], b).token_ids[0] for _ in range(20)]

    assert seeded(5) == seeded(5)


def test_every_64_bit_seed_has_its_own_cpu_stream_and_32_bit_seeds_keep_theirs():
    def draws(gen):
        return torch.empty(8).exponential_(generator=gen).tolist()

    seeds = [5, 5 + 2**32, 5 + 2**33, 5 + 2**62, 2**32 - 1, -1, 2**63 - 1, -2**63, 0]
    streams = [draws(seeded_generator(s, "cpu")) for s in seeds]
    assert len({tuple(x) for x in streams}) == len(seeds)
    assert streams == [draws(seeded_generator(s, "cpu")) for s in seeds]  # each repeats
    assert streams[0] == draws(torch.Generator().manual_seed(5))  # seeded text of a 32-bit seed is as it was


def test_greedy_rows_ignore_temperature_rows():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    batch = SamplingBatch.build([SamplingParams(temperature=0), SamplingParams(temperature=5.0, logprobs=2)],
                                [None, None], 3, "cpu")
    out = Sampler()(logits, batch)
    assert out.token_ids[0] == 1
    assert out.top_ids[1] == [1, 2] and abs(out.logprobs[0] - torch.log_softmax(logits[0], -1)[1].item()) < 1e-6


def test_all_greedy_batches_build_no_row_tensors():
    batch = SamplingBatch.build([SamplingParams(temperature=0)] * 3, [None] * 3, 10, "cpu")
    assert batch.all_greedy and batch.temperatures is None and batch.top_p is None
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    assert Sampler()(logits, batch).token_ids == [1, 0, 2]


def test_a_projection_without_a_plan_runs_cublas_and_follows_the_backend_switch():
    from hosttune_engine.layers.backend import set_kernel_backend
    from hosttune_engine.layers.linear import Linear

    model = torch.nn.Sequential(Linear(8, 4), Linear(4, 2))
    set_kernel_backend(model, True)
    x = torch.randn(1, 8)
    assert torch.allclose(model(x), x @ model[0].weight.t() @ model[1].weight.t()
                          + model[0].bias @ model[1].weight.t() + model[1].bias, atol=1e-6)  # no plan: F.linear
    assert model[0].use_triton and model[1].use_triton
    set_kernel_backend(model, False)
    assert not model[0].use_triton and not model[1].use_triton


def test_device_sample_is_copied_to_the_host_when_sampled_not_when_read():
    """The engine reads a step's tokens after launching the next step; a copy made then would wait for it."""
    logits = torch.log(torch.tensor([[0.1, 0.9], [0.8, 0.2]]))
    batch = SamplingBatch.build([SamplingParams(temperature=0, logprobs=1)] * 2, [None] * 2, 2, "cpu")
    sample = Sampler().sample(logits, batch)
    sample.tokens.fill_(7)  # what a later step could do to the device buffers
    sample.logprobs.fill_(0.0)
    out = sample.to_host()
    assert out.token_ids == [1, 0] and out.logprobs == pytest.approx([math.log(0.9), math.log(0.8)], abs=1e-6)
    assert out.top_ids == [[1], [0]]
