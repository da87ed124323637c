"""The chunk-attention benchmark (benchmarks/engine/chunk_attention.py) on its tiny CPU setup: every variant
runs and is checked against the reference, and the table has a row per case."""

import pytest
import torch

from benchmarks.engine import chunk_attention as bench
from .conftest import HAS_CUDA


@pytest.fixture
def chunk_attention():
    return bench


@pytest.mark.skipif(HAS_CUDA, reason="its tiny setup is on the CPU, under the Triton interpreter")
def test_each_variant_is_timed_and_checked(chunk_attention):
    setup, gen = chunk_attention.SMALL, torch.Generator().manual_seed(0)
    results = [chunk_attention.measure(chunk_attention.Case(setup, seqs, gen), on_cuda=False)
               for seqs in (((16, 37),), ((8, 50), (24, 24)))]
    one, two = results
    assert (one.pairs, two.pairs) == (16 * 37 + 16 * 17 // 2, 8 * 50 + 8 * 9 // 2 + 24 * 24 + 24 * 25 // 2)
    for r in results:
        assert {t.name for t in r.timings} == {"1x32/16/4w2s", "3x32/16/4w2s", "1x64/32/4w1s", "3x64/32/4w1s",
                                              "auto"}
        assert all(t.max_err < setup.tol and t.ms > 0 and t.ns_per_pair > 0 for t in r.timings)
        assert r.get("auto").splits == 1  # no split off a GPU
        assert r.best().name != "auto"
    lines = chunk_attention.table(results, "1x32/16/4w2s").splitlines()
    assert len(lines) == 3 and lines[1].split()[0] == "16@37" and lines[2].split()[0] == "8@50+24@24"
