"""Block manager: pure integer bookkeeping, no torch, milliseconds."""

import subprocess
import sys

import pytest

from hosttune_engine.core.block_manager import BlockManager
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.sampling import SamplingParams

BS = 4


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=8))


def admit(bm, s, n=None):
    cached = bm.lookup_prefix(s)
    n = s.num_tokens - len(cached) * BS if n is None else n
    assert bm.can_allocate(s, n, cached)
    bm.allocate(s, n, cached)
    return cached


def test_block_manager_and_scheduler_import_without_torch():
    code = (
        "import sys; import hosttune_engine.core.block_manager, hosttune_engine.core.scheduler, "
        "hosttune_engine.sampling, hosttune_engine.config; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_allocate_covers_tokens_and_free_returns_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS)
    s = seq(range(10))
    admit(bm, s)
    assert len(s.block_table) == 3  # ceil(10 / 4)
    assert bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == [] and s.num_computed_tokens == 0


def test_decode_appends_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=8, block_size=BS)
    s = seq(range(8))
    admit(bm, s)
    s.num_computed_tokens = 8
    assert len(s.block_table) == 2
    s.append_token(100)  # token 9 needs a third block
    bm.allocate(s, 1)
    assert len(s.block_table) == 3
    s.num_computed_tokens = 9
    s.append_token(101)
    bm.allocate(s, 1)
    assert len(s.block_table) == 3


def test_prefix_hit_shares_blocks_and_counts_tokens():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(list(range(13)), "a")
    admit(bm, a)
    a.num_computed_tokens = 13
    b = seq(list(range(12)) + [99, 98], "b")  # shares 3 full blocks
    cached = admit(bm, b)
    assert cached == a.block_table[:3]
    assert b.block_table[:3] == a.block_table[:3]
    assert b.num_computed_tokens == 12 and b.num_cached_tokens == 12
    assert all(bm.blocks[i].ref_count == 2 for i in cached)
    assert bm.num_prefix_queries == 13 + 14
    assert bm.num_prefix_hits == 12


def test_a_prompt_finds_the_blocks_a_running_prefill_has_filled_so_far():
    """A shared prefix is found while the sequence that computes it is still in its prefill: the blocks its
    chunks so far fill are findable from the step that computes them, the rest are computed again."""
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(list(range(13)), "a")
    admit(bm, a, n=8)  # its first chunk: two full blocks
    b = seq(list(range(12)) + [99], "b")
    assert admit(bm, b) == a.block_table[:2]
    assert (b.num_cached_tokens, bm.num_prefix_hits) == (8, 8)


def test_lookup_leaves_at_least_one_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = seq(range(8), "a")
    admit(bm, a)
    b = seq(range(8), "b")  # identical prompt of exactly two blocks
    assert len(bm.lookup_prefix(b)) == 1


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(range(9), "a")
    admit(bm, a)
    bm.free(a)
    b = seq(range(9), "b")
    assert bm.lookup_prefix(b) == a.block_table[:2] or len(bm.lookup_prefix(b)) == 2
    admit(bm, b)
    assert b.num_cached_tokens == 8
    assert bm.num_free_blocks == 1
    bm.free(b)
    c = seq([50 + i for i in range(16)], "c")  # needs all 4 blocks: evicts the cache
    admit(bm, c)
    assert bm.hash_to_block == {bm.blocks[i].hash: i for i in c.block_table}
    assert bm.lookup_prefix(seq(range(9), "d")) == []


def test_partial_blocks_are_reused_before_cached_ones():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(range(6), "a")  # one full (hashed) block, one partial
    admit(bm, a)
    full, partial = a.block_table
    bm.free(a)
    assert next(iter(bm.free_ids)) == partial
    b = seq([70], "b")
    admit(bm, b)
    assert b.block_table == [partial]
    assert len(bm.lookup_prefix(seq(range(6), "c"))) == 1  # block `full` is still cached


def test_can_allocate_counts_revived_cached_blocks():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = seq(range(9), "a")
    admit(bm, a)
    bm.free(a)  # 2 hashed blocks and 1 partial are free
    b = seq(range(9), "b")
    cached = bm.lookup_prefix(b)
    assert len(cached) == 2
    assert bm.can_allocate(b, 1, cached)  # 2 revived + 1 new = 3
    assert not bm.can_allocate(b, 5, cached)  # would need 4


def test_hash_collision_is_a_miss(monkeypatch):
    import hosttune_engine.core.block_manager as mod

    monkeypatch.setattr(mod, "chain_hash", lambda parent, tokens: 7)
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq(range(9), "a")
    admit(bm, a)
    b = seq([5, 5, 5, 5, 6, 6, 6, 6, 1], "b")  # same (fake) hashes, other tokens
    assert bm.lookup_prefix(b) == []


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = seq(range(9), "a")
    admit(bm, a)
    assert bm.lookup_prefix(seq(range(9), "b")) == []
    assert bm.hash_to_block == {}


@pytest.mark.parametrize("caching", [False, True])
def test_append_for_a_decode_batch_equals_allocate_one_token_each(caching):
    """The scheduler's decode fast path: `append(seqs)` takes the same blocks and registers the same hashes."""
    def run(one_by_one):
        bm = BlockManager(num_blocks=64, block_size=BS, enable_prefix_caching=caching)
        seqs = [seq(range(i, i + 3 + i), rid=str(i)) for i in range(5)]
        for s in seqs:
            admit(bm, s)
            s.num_computed_tokens = s.num_tokens
        for step in range(9):
            for s in seqs:
                s.append_token(100 + step)
            if one_by_one:
                for s in seqs:
                    assert bm.can_allocate(s, 1)
                    bm.allocate(s, 1)
            else:
                assert bm.can_append(seqs)
                bm.append(seqs)
            for s in seqs:
                s.num_computed_tokens += 1
        return [s.block_table for s in seqs], dict(bm.hash_to_block), list(bm.free_ids)
    assert run(one_by_one=False) == run(one_by_one=True)


def test_can_append_counts_the_blocks_a_decode_batch_needs():
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=False)
    a, b = seq(range(4), "a"), seq(range(3), "b")
    admit(bm, a), admit(bm, b)  # a's block is full, b's has room
    for s in (a, b):
        s.num_computed_tokens = s.num_tokens
        s.append_token(7)
    assert bm.can_append([a, b])  # a needs one block, one is free
    bm.allocate(seq(range(4), "c"), 4)
    assert not bm.can_append([a, b]) and bm.can_append([b])


def prompts_in_turn(num_prefixes: int, num_requests: int = 60) -> float:
    """The share of prompt tokens found cached when requests of `num_prefixes` shared 200-token prefixes
    come in turn, each with its own question, to a cache of 72 blocks of 16 (docs/deploy.md)."""
    bm = BlockManager(num_blocks=72, block_size=16)
    prefixes = [[1000 * p + i for i in range(203)] for p in range(num_prefixes)]
    for r in range(num_requests):
        s = Sequence(f"r{r}", prefixes[r % num_prefixes] + [900_000 + r] * 10, SamplingParams(max_tokens=4))
        cached = bm.lookup_prefix(s)
        bm.allocate(s, s.num_tokens - len(cached) * 16, cached)
        bm.free(s)
    return bm.num_prefix_hits / bm.num_prefix_queries


def test_a_cache_holds_the_prefixes_it_has_room_for_and_none_past_that():
    """Least recently freed first: prefixes that fit are found; sent more in turn than it holds, each one is
    evicted just before it comes back (the sizing rule docs/deploy.md gives for the router's replicas)."""
    assert [round(prompts_in_turn(n), 2) for n in (5, 6, 7)] == [0.83, 0.41, 0.0]
