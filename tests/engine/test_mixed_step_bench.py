"""The mixed-step benchmark (benchmarks/engine/mixed_step.py) on a tiny model on the CPU: both paths are
timed on the same step, the graph path's logits are the eager path's, and the table has a row per shape."""

import pytest

from benchmarks.engine import mixed_step as bench


@pytest.fixture
def mixed_step():
    return bench


def test_each_shape_is_timed_on_both_paths(mixed_step):
    engine = mixed_step.build_engine(small=True)
    steps = mixed_step.Steps(engine, decode_context=32)
    free = engine.block_manager.num_free_blocks
    results = [mixed_step.measure_shape(engine, steps, d, p, [32, 64], reps=1, on_cuda=False)
               for d, p in ((4, 12), (2, 70))]
    assert engine.block_manager.num_free_blocks == free  # every synthetic sequence freed
    inside, past = results
    assert (inside.tokens, inside.bucket, inside.own_bucket) == (16, 32, False)
    assert (past.tokens, past.bucket, past.own_bucket) == (72, 80, True)  # a bucket of its own
    for r in results:
        assert r.eager.host_ms > 0 and r.graphs.step_ms >= r.graphs.host_ms and r.eager.gpu_ms is None
        assert r.argmax_agree == 1.0 and r.max_abs_diff < 1e-4
    lines = mixed_step.table(results, 0.5, [32, 64], 3).splitlines()
    assert len(lines) == 4 and "2 buckets x 3 segments" in lines[0] and "80+" in lines[3]
