"""Runs the model for one scheduled step: pack inputs, forward, sample.

Inputs are packed as the attention layer expects (prefill chunks first, then
one token per decoding sequence). `_forward` is the single entry to the model,
so decode-only steps can later be replayed from CUDA graphs captured per batch
size: their kernels' grids depend on the batch size only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.cache.kv_pool import KVCacheShape, KVPool, num_blocks_for_memory
from hosttune_engine.config import EngineConfig
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.errors import ConfigError
from hosttune_engine.kernels.decode_attention import choose_num_splits
from hosttune_engine.layers.attention import AttentionMetadata
from hosttune_engine.layers.backend import set_kernel_backend
from hosttune_engine.layers.sampler import Sampler, SamplerOutput, SamplingBatch
from hosttune_engine.model.loader import load_model
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.sampling import SamplingParams

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32  # CPU half-precision matmuls are slow and loose
    return torch.float16 if checkpoint_dtype == "float16" else torch.bfloat16


@dataclass
class StepResult:
    tokens: list[int | None]  # per scheduled sequence; None for a prefill chunk short of its end
    sampled: SamplerOutput | None  # rows in the order of the non-None tokens


@dataclass
class _Batch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [N] row of each sampled sequence's last token
    sample_seqs: list[Sequence]


class ModelRunner:
    """Owns the model, its KV pool and the sampler on one device."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        self.config = config
        self.model_config = model_config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, model_config.dtype, self.device)
        self.block_size = config.block_size
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        torch.manual_seed(config.seed)
        self.model = load_model(model_config, config.model, config.load_format, self.device, self.dtype, config.seed)
        self.use_triton = config.kernel_backend == "triton" or (
            config.kernel_backend == "auto" and self.device.type == "cuda")
        set_kernel_backend(self.model, self.use_triton)
        self.kv_shape = KVCacheShape(model_config.num_layers, config.block_size, model_config.num_kv_heads,
                                     model_config.head_dim, torch.finfo(self.dtype).bits // 8)
        self.num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else 1)
        self.num_kv_blocks = self._size_kv_pool()
        self.kv_pool = KVPool(self.kv_shape, self.num_kv_blocks, self.device, self.dtype)
        self.kv_pool.bind(self.model)
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}

    # -- KV pool sizing ----------------------------------------------------------
    def _size_kv_pool(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.device.type != "cuda":
            return max(1, int(self.config.cpu_kv_cache_gib * 2**30) // self.kv_shape.bytes_per_block)
        peak = self._profile_activation_bytes()
        free, _ = torch.cuda.mem_get_info(self.device)
        blocks = num_blocks_for_memory(free, self.config.gpu_memory_utilization, peak, self.kv_shape)
        if blocks * self.block_size < self.max_model_len:
            raise ConfigError(
                f"the KV cache fits {blocks * self.block_size} tokens, fewer than max_model_len="
                f"{self.max_model_len}; raise gpu_memory_utilization or lower max_model_len")
        return blocks

    @torch.inference_mode()
    def _profile_activation_bytes(self) -> int:
        """Peak activation memory of the largest step, measured with a throwaway KV pool."""
        tokens = min(self.config.max_num_batched_tokens, self.max_model_len)
        pool = KVPool(self.kv_shape, -(-tokens // self.block_size), self.device, self.dtype)
        pool.bind(self.model)
        seq = Sequence("profile", [0] * tokens, SamplingParams(max_tokens=1))
        seq.block_table = list(range(pool.num_blocks))
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        batch = self._prepare(SchedulerOutput(seqs=[seq], num_new_tokens=[tokens]))
        hidden = self._forward(batch)
        rows = min(self.config.max_num_seqs, tokens)
        self.model.compute_logits(hidden[:rows]).softmax(-1)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del pool, hidden, batch
        torch.cuda.empty_cache()
        return peak

    # -- one step ------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> StepResult:
        batch = self._prepare(sched)
        hidden = self._forward(batch)
        sampled = None
        if batch.sample_seqs:
            logits = self.model.compute_logits(hidden[batch.sample_rows])  # [N, V] fp32
            sampling = SamplingBatch.build([s.sampling for s in batch.sample_seqs],
                                           [self._generator(s) for s in batch.sample_seqs],
                                           logits.shape[-1], self.device)
            sampled = self.sampler(logits, sampling)
        tokens: list[int | None] = []
        it = iter(sampled.token_ids if sampled else [])
        for seq, needs in zip(sched.seqs, sched.sample_mask()):
            tokens.append(next(it) if needs else None)
        return StepResult(tokens, sampled)

    def _forward(self, batch: _Batch) -> torch.Tensor:
        return self.model(batch.input_ids, batch.positions, batch.meta)  # [T, H]

    @torch.inference_mode()
    def prefill_logits(self, seq: Sequence) -> torch.Tensor:
        """Logits at every prompt position of a sequence whose blocks are allocated (tests, scoring)."""
        batch = self._prepare(SchedulerOutput(seqs=[seq], num_new_tokens=[seq.num_uncomputed_tokens]))
        return self.model.compute_logits(self._forward(batch))

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.sampling.seed is None or seq.sampling.is_greedy:
            return None
        gen = self.generators.get(seq.request_id)
        if gen is None:
            gen = self.generators[seq.request_id] = torch.Generator(self.device).manual_seed(seq.sampling.seed)
        return gen

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    # -- input packing ---------------------------------------------------------------
    def _prepare(self, sched: SchedulerOutput) -> _Batch:
        ids, pos, slots, sample_rows, sample_seqs = [], [], [], [], []
        prefill: list[tuple[int, int, list[int]]] = []  # (query len, context len, block table)
        decode: list[tuple[int, list[int]]] = []
        for seq, n in zip(sched.seqs, sched.num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
            slots.extend(self._slots(seq.block_table, start, end))
            (prefill.append((n, end, seq.block_table)) if n > 1 else decode.append((end, seq.block_table)))
            if end == seq.num_tokens:
                sample_rows.append(len(ids) - 1)
                sample_seqs.append(seq)
        dev = self.device
        return _Batch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            meta=self._metadata(prefill, decode, torch.tensor(slots, dtype=torch.int64, device=dev)),
            sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=dev),
            sample_seqs=sample_seqs,
        )

    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs, out = self.block_size, []
        for i in range(start // bs, -(-end // bs)):
            lo, hi = max(start, i * bs) - i * bs, min(end, (i + 1) * bs) - i * bs
            base = block_table[i] * bs
            out.extend(range(base + lo, base + hi))
        return out

    def _metadata(self, prefill, decode, slot_mapping) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=slot_mapping, num_prefill_tokens=sum(q for q, _, _ in prefill))
        if prefill:
            cu = [0]
            for q, _, _ in prefill:
                cu.append(cu[-1] + q)
            meta.prefill_cu_seqlens_q = self._int32(cu)
            meta.prefill_seq_lens = self._int32([c for _, c, _ in prefill])
            meta.prefill_block_tables = self._block_tables([t for _, _, t in prefill])
            meta.prefill_max_query_len = max(q for q, _, _ in prefill)
        if decode:
            meta.decode_seq_lens = self._int32([c for c, _ in decode])
            meta.decode_block_tables = self._block_tables([t for _, t in decode])
            meta.decode_num_splits = choose_num_splits(len(decode), self.model_config.num_kv_heads,
                                                       max(c for c, _ in decode), self.num_sms)
        return meta

    def _int32(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def _block_tables(self, tables: list[list[int]]) -> torch.Tensor:
        width = max(len(t) for t in tables)
        return self._int32([t + [0] * (width - len(t)) for t in tables])
