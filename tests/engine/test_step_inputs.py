"""A step's attention metadata as packed on the host: the lengths the attention kernels choose their grids
and split counts from are known without reading the device."""

import torch

from hosttune_engine import SamplingParams
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.step_inputs import HostPack, pack_attention, plan_step


def test_prefill_metadata_carries_the_longest_query_and_context():
    a = Sequence("a", list(range(100, 130)), SamplingParams())
    a.num_computed_tokens, a.block_table = 20, [7, 3, 9, 4, 2, 8, 1, 6]  # a chunk of 6 after 20 cached tokens
    b = Sequence("b", list(range(9)), SamplingParams())
    b.num_computed_tokens, b.block_table = 0, [5, 10, 11]  # a fresh prompt of 9
    c = Sequence("c", [50, 51, 52], SamplingParams())
    c.num_computed_tokens, c.block_table = 2, [12]  # a decode at context 3
    plan = plan_step(SchedulerOutput(seqs=[a, b, c], num_new_tokens=[6, 9, 1]), block_size=4)
    _, meta, _ = pack_attention(plan, HostPack(), torch.device("cpu"), num_kv_heads=1, num_sms=132)
    assert (meta.num_prefill_tokens, meta.prefill_max_query_len, meta.prefill_max_context) == (15, 9, 26)
    assert meta.prefill_seq_lens.tolist() == [26, 9] and meta.prefill_has_prefix
    assert meta.decode_seq_lens.tolist() == [3]
