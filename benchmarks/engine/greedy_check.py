"""The fast path (Triton kernels, CUDA graphs) gives the same greedy tokens as the
torch reference path, in fp32 on the same Qwen2.5-7B-shaped weights (bf16 random weights have
near-ties at most steps: benchmarks/history/NOTES.md "Engine correctness on H200")."""

from __future__ import annotations

import torch

from benchmarks.engine.common import QWEN25_7B, model_folder
from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.layers.backend import set_kernel_backend


def _generate(engine: Engine, prompts, max_tokens: int, tag: str):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    tokens, logprobs = {}, {}
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}{i}", ids, params))
        tokens[f"{tag}{i}"], logprobs[f"{tag}{i}"] = [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            logprobs[out.request_id].extend(lp.logprob for lp in out.new_logprobs or ())
    return list(tokens.values()), list(logprobs.values())


def fast_vs_reference(prompt_lens=(7, 300, 1500, 3000), max_tokens: int = 24) -> dict:
    """A 2,048-token step budget chunks the 3,000-token prompt: paged prefill and mixed steps run too."""
    engine = Engine(EngineConfig(model=model_folder(QWEN25_7B), load_format="dummy", dtype="float32",
                                 kernel_backend="triton", max_model_len=4096, num_kv_blocks=1536, max_num_seqs=8,
                                 max_cuda_graph_batch_size=8, enable_prefix_caching=False, max_num_batched_tokens=2048))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, QWEN25_7B["vocab_size"], (n,), generator=gen).tolist() for n in prompt_lens]
    assert engine.runner.graphs is not None and engine.runner.graphs.use_graphs
    assert engine.runner.prefill_graphs is not None and engine.runner.prefill_graphs.use_graphs
    # all prompts together (batched decode, cuBLAS), then the second alone (its prefill on a prefill graph,
    # its decode at batch 1: the Triton GEMV)
    fast = [a + b for a, b in zip(_generate(engine, prompts, max_tokens, "fast"),
                                  _generate(engine, prompts[1:2], max_tokens, "solo"))]
    engine.runner.graphs = engine.runner.prefill_graphs = None  # captured graphs hold the Triton kernels
    set_kernel_backend(engine.runner.model, False)
    ref = [a + b for a, b in zip(_generate(engine, prompts, max_tokens, "ref"),
                                 _generate(engine, prompts[1:2], max_tokens, "refsolo"))]
    rows = []
    for n, ft, fl, rt, rl in zip([*prompt_lens, f"{prompt_lens[1]} alone"], *fast, *ref):
        agree = next((i for i, (a, b) in enumerate(zip(ft, rt)) if a != b), len(ft))
        diff = max((abs(a - b) for a, b in zip(fl[:agree], rl[:agree])), default=0.0)
        rows.append({"prompt_tokens": n, "agree": agree, "of": len(ft), "max_logprob_diff": diff})
    del engine
    torch.cuda.empty_cache()
    return {"dtype": "float32", "rows": rows, "all_equal": all(r["agree"] == r["of"] for r in rows)}
