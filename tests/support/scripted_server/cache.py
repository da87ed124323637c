"""The scripted server's prefix cache and its /metrics, so bench's workloads that share
prefixes, and its /metrics sampling, can be tested against known behaviour.

Tokens are counted as the server counts them (a BOS, then one per word) and cached in
blocks of `BLOCK` tokens keyed by chained hashes, as vLLM does: a request's cached tokens
are its leading full blocks that an earlier request already had. Nothing is evicted
until `MAX_BLOCKS` are held; then the cache starts empty again.
"""

from __future__ import annotations

BLOCK = 16
MAX_BLOCKS = 1_000_000


class PrefixCache:
    def __init__(self) -> None:
        self.blocks: set[int] = set()

    def admit(self, text: str) -> int:
        """Insert the prompt's blocks; return how many of its tokens were cached."""
        tokens = ["<s>"] + text.split()
        key, num_cached, is_hit = 0, 0, True
        if len(self.blocks) > MAX_BLOCKS:
            self.blocks.clear()
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            key = hash((key, *tokens[start:start + BLOCK]))
            is_hit = is_hit and key in self.blocks
            num_cached += BLOCK if is_hit else 0
            self.blocks.add(key)
        return num_cached


def render_metrics(num_waiting: int, num_running: int, capacity: int | None) -> str:
    """Prometheus text with vLLM's names: the queue, the batch, the KV cache's use (the
    share of slots busy) and preemptions (the scripted server never preempts)."""
    usage = num_running / capacity if capacity else 0.0
    lines = []
    for name, kind, value in (("vllm:num_requests_waiting", "gauge", num_waiting),
                              ("vllm:num_requests_running", "gauge", num_running),
                              ("vllm:kv_cache_usage_perc", "gauge", usage),
                              ("vllm:num_preemptions_total", "counter", 0)):
        lines += [f"# TYPE {name} {kind}", f'{name}{{model_name="scripted"}} {value}']
    return "\n".join(lines) + "\n"
