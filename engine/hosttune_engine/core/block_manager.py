"""KV block accounting: ids, reference counts, prefix caching (torch-free).

A block is `block_size` token slots in every layer's KV cache. A full block is
identified by a chained hash: hash(parent block's hash, its own token ids), so
equal hashes mean equal prefixes up to and including that block (the token ids
are compared too, so a hash collision is a miss, not a wrong answer). Sequences
that share a cached prefix point at the same blocks (no copies); a block whose
reference count drops to zero stays findable by its hash until it is reused,
least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hosttune_engine.core.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """The hash of a full block given its parent's hash (None for the first block)."""
    return hash((-1 if parent is None else parent, token_ids))


class BlockManager:
    """Hands out KV blocks to sequences and finds cached prefixes.

    Pairs: `lookup_prefix` then `can_allocate` / `allocate` when a step needs
    slots; `free` when a sequence finishes or is preempted.
    Counters (for metrics): `num_prefix_queries` and `num_prefix_hits`, in tokens.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0

    # -- state a metrics layer reads ----------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (cached-but-free blocks count as free)."""
        return 1.0 - len(self.free_ids) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix caching -----------------------------------------------------
    def lookup_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached full-block prefix of a new sequence.

        At least one token is always left to compute, so the step that follows
        produces logits for the last prompt token.
        """
        if not self.enable_prefix_caching or seq.block_table:
            return []
        hits: list[int] = []
        for i in range((seq.num_tokens - 1) // self.block_size):
            block_id = self.hash_to_block.get(self._block_hash(seq, i))
            if block_id is None:
                break
            if self.blocks[block_id].token_ids != seq.block_tokens(i, self.block_size):
                break  # a hash collision: treat as a miss
            hits.append(block_id)
        return hits

    def _block_hash(self, seq: Sequence, index: int) -> int:
        while len(seq.block_hashes) <= index:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[i - 1] if i else None
            seq.block_hashes.append(chain_hash(parent, seq.block_tokens(i, self.block_size)))
        return seq.block_hashes[index]

    # -- allocation -----------------------------------------------------------
    def _num_new_blocks(self, seq: Sequence, num_new_tokens: int, cached: list[int]) -> int:
        num_computed = seq.num_computed_tokens if seq.block_table else len(cached) * self.block_size
        needed = self.blocks_for(num_computed + num_new_tokens)
        return max(0, needed - len(seq.block_table) - len(cached))

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Whether `num_new_tokens` more tokens of `seq` fit, reusing `cached` blocks."""
        num_revived = sum(1 for b in cached if self.blocks[b].ref_count == 0) if cached else 0
        return self._num_new_blocks(seq, num_new_tokens, cached) + num_revived <= len(self.free_ids)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> None:
        """Give `seq` slots for its next `num_new_tokens` tokens.

        For a sequence without blocks, `cached` (from `lookup_prefix`) become its
        first blocks and count as computed. Blocks that this step fills are
        registered under their hash, so later requests can share them.
        """
        num_new = self._num_new_blocks(seq, num_new_tokens, cached)
        if not seq.block_table:
            self._take_cached(seq, cached)
        for _ in range(num_new):
            seq.block_table.append(self._take_free_block())
        self.register_full_blocks(seq, seq.num_computed_tokens + num_new_tokens)

    # -- the decode step: one more token for each of many sequences ------------------
    def can_append(self, seqs: list[Sequence]) -> bool:
        """Whether every one of `seqs` (each holding blocks for its computed tokens) fits one more token."""
        bs = self.block_size
        return sum(s.num_computed_tokens // bs + 1 > len(s.block_table) for s in seqs) <= len(self.free_ids)

    def append(self, seqs: list[Sequence]) -> None:
        """`allocate(seq, 1)` for each of `seqs` in order, in one pass (after `can_append`)."""
        bs, caching = self.block_size, self.enable_prefix_caching
        for seq in seqs:
            computed, table = seq.num_computed_tokens, seq.block_table
            if computed // bs + 1 > len(table):
                table.append(self._take_free_block())
            if caching and (computed + 1) % bs == 0:  # this token fills its block
                self.register_full_blocks(seq, computed + 1)

    def _take_cached(self, seq: Sequence, cached: list[int]) -> None:
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.num_computed_tokens = seq.num_cached_tokens = len(cached) * self.block_size
        self.num_prefix_queries += seq.num_tokens
        self.num_prefix_hits += seq.num_cached_tokens

    def _take_free_block(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]  # evict: the cached prefix is gone
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def register_full_blocks(self, seq: Sequence, num_tokens_after_step: int) -> None:
        """Make the blocks that `seq`'s first `num_tokens_after_step` tokens fill findable by their hash; only
        blocks of known tokens (a token still on the device is registered once it is appended)."""
        if not self.enable_prefix_caching:
            return
        first = seq.num_computed_tokens // self.block_size  # earlier blocks are registered
        for i in range(first, min(num_tokens_after_step, seq.num_known_tokens) // self.block_size):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue
            block.hash = self._block_hash(seq, i)
            block.token_ids = seq.block_tokens(i, self.block_size)
            self.hash_to_block.setdefault(block.hash, block.block_id)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; its full blocks stay cached until reused."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free_ids[block_id] = None
                if block.hash is None:  # nothing worth keeping: reuse it first
                    self.free_ids.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_computed_tokens = 0
