"""Runs the model for one scheduled step: pack inputs, forward, sample.

Decode-only steps on CUDA replay a CUDA graph captured per batch size
(`core.cuda_graphs`), a step of one short prompt chunk one captured per
padded length (`core.prefill_graphs`), and other steps of up to 1,024 tokens
piecewise graphs per padded token count, with attention run between them
(`core.mixed_graphs`); the rest run eagerly on inputs packed by
`core.step_inputs`.

A step is `launch` (pack, enqueue the device work) then `collect` (wait, read
the tokens back), so the engine can do host work while the device computes.
A step's tokens are also left on the device, in the decode graphs' token
buffer: the next step may be launched on them (`launch(..., after=...)`)
before they are read back, its rows whose token is pending taking it there.

With tensor parallelism (`group`), every rank has a runner over its shard of
the model and of the KV pool. Rank 0 broadcasts each step's message before
it launches the step; the other ranks `replay` it, the same kernels and
collectives in the same order, and sample nothing. With one GPU there is no
group and nothing of this runs.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch

from hosttune_engine.cache.kv_pool import KVCacheShape, KVPool, check_free_memory, num_blocks_for_memory
from hosttune_engine.cache.kv_shape import blocks_in_gib, check_holds_context
from hosttune_engine.config import EngineConfig
from hosttune_engine.core.cuda_graphs import DecodeGraphs, DecodeInputs, capture_sizes
from hosttune_engine.core.device import resolve_device, resolve_dtype, use_triton
from hosttune_engine.core.mixed_graphs import MixedGraphs, MixedInputs, SegmentBuffers, mixed_sizes
from hosttune_engine.core.prefill_graphs import PREFILL_GRAPH_SIZES, PrefillGraphs, PrefillInputs
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.step_inputs import StepInputs, pack_step, plan_step
from hosttune_engine.host_copy import HostCopy
from hosttune_engine.kernels.decode_attention import choose_num_splits
from hosttune_engine.kernels.split_k import device_sms
from hosttune_engine.layers.logit_adjustments import TokenHistory
from hosttune_engine.layers.sampler import DeviceSample, Sampler, SamplerOutput, SamplingBatch, seeded_generator
from hosttune_engine.model.loader import load_model
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.group import TensorParallelGroup
from hosttune_engine.parallel.layout import ShardLayout
from hosttune_engine.core.step_message import StepKind, step_message
from hosttune_engine.parallel.transform import gather_logits, shard_model
from hosttune_engine.plan.gpus import present_gpu
from hosttune_engine.planner.prepare import prepare
from hosttune_engine.sampling import SamplingParams

log = logging.getLogger(__name__)


@contextmanager
def _phase(what: str):
    """Log how long a start-up phase took (the parts of the time to healthy)."""
    start = time.perf_counter()
    yield
    log.info("%s in %.1f s", what, time.perf_counter() - start)


@dataclass
class StepResult:
    tokens: list[int | None]  # per scheduled sequence; None for a prefill chunk short of its end
    sampled: SamplerOutput | None  # rows in the order of the non-None tokens


@dataclass
class LaunchedStep:
    """A step enqueued on the device whose tokens are not read back yet (`ModelRunner.collect` does)."""

    mask: list[bool]  # per scheduled sequence: whether it gets a token this step
    greedy_tokens: HostCopy | None  # the decode graph's argmax of every row (`mask` picks), to the host
    sampled: DeviceSample | None  # the sampler's tokens (and logprobs), on the device
    feeds_next: bool = False  # its tokens are in the decode graphs' token buffer, so the next step can take them
    token_seqs: list[Sequence] | None = None  # with `feeds_next`: the sequence of each row of that buffer


class ModelRunner:
    """Owns the model, its KV pool and the sampler on one device (this rank's shards of the model and the
    pool with a tensor-parallel `group`)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, group: TensorParallelGroup | None = None):
        self.config = config
        self.model_config = model_config
        self.group = group
        self._released: list[str] = []  # requests finished since the last step message (tensor parallel)
        self.device = group.device if group is not None else resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, model_config.dtype, self.device)
        self.block_size = config.block_size
        self.max_model_len = context_length(config, model_config)
        torch.manual_seed(config.seed)
        layout = ShardLayout.of(model_config, group.rank, group.world_size) if group is not None else None
        shard = partial(shard_model, layout=layout, group=group) if group is not None else None
        with _phase("model loaded"):
            self.model = load_model(model_config, config.model, config.load_format, self.device, self.dtype,
                                    config.seed, config.quantization, shard=shard)
        self.use_triton = use_triton(config.kernel_backend, self.device)
        self.plan = prepare(self.model, present_gpu(self.device), self.use_triton, config.kv_cache_dtype == "fp8",
                            config.block_size)
        if group is not None:
            gather_logits(self.model, group)  # after the plan's LM head: it wraps every path
        self.num_kv_heads = layout.num_kv_heads if layout is not None else model_config.num_kv_heads
        fp8_kv = config.kv_cache_dtype == "fp8"
        self.kv_shape = KVCacheShape(model_config.num_layers, config.block_size, self.num_kv_heads,
                                     model_config.head_dim, 1 if fp8_kv else torch.finfo(self.dtype).bits // 8,
                                     fp8_kv)
        self.num_sms = device_sms(self.device) if self.device.type == "cuda" else 1
        with _phase("KV pool sized"):
            self.num_kv_blocks = self._size_kv_pool()
        self.kv_pool = KVPool(self.kv_shape, self.num_kv_blocks, self.device, self.dtype)
        self.kv_pool.bind(self.model)
        self.sampler = Sampler()
        self.eos_token_ids = tuple(model_config.eos_token_ids)  # min_tokens holds them back (+ the tokenizer's)
        self.generators: dict[str, torch.Generator] = {}
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None
        if self.device.type == "cuda" and self.use_triton and not config.enforce_eager:
            with _phase("decode graphs captured"):
                self.graphs = self.build_decode_graphs(use_graphs=True)
            with _phase("prefill graphs captured"):
                self.prefill_graphs = self.build_prefill_graphs(use_graphs=True)
            with _phase("mixed-step graphs captured"):
                self.mixed_graphs = self.build_mixed_graphs(use_graphs=True)

    def build_decode_graphs(self, use_graphs: bool, max_batch: int | None = None) -> DecodeGraphs:
        """Persistent decode buffers and, with `use_graphs`, one captured graph per batch size
        (without, the padded buffers run eagerly: how CPU tests exercise this path)."""
        max_batch = max_batch or min(self.config.max_num_seqs, self.config.max_cuda_graph_batch_size)
        width = -(-self.max_model_len // self.block_size)
        inputs = DecodeInputs(max_batch, width, self.block_size, self.device)
        graphs = DecodeGraphs(self._decode_logits, inputs, capture_sizes(max_batch), self._graph_num_splits,
                              use_graphs)
        graphs.capture()
        return graphs

    def build_prefill_graphs(self, use_graphs: bool) -> PrefillGraphs:
        """Buffers and, with `use_graphs`, graphs for one short prompt chunk per step (`core.prefill_graphs`)."""
        capacity = min(max(PREFILL_GRAPH_SIZES), self.config.max_num_batched_tokens, self.max_model_len)
        inputs = PrefillInputs(capacity, -(-self.max_model_len // self.block_size), self.block_size, self.device)
        graphs = PrefillGraphs(self.model, self.model.compute_logits, inputs, use_graphs)
        graphs.capture()
        return graphs

    def build_mixed_graphs(self, use_graphs: bool, sizes: list[int] | None = None) -> MixedGraphs:
        """Static buffers and, with `use_graphs`, piecewise graphs for the other steps up to a bucket's tokens
        (`core.mixed_graphs`)."""
        sizes = mixed_sizes(self.config.max_num_batched_tokens) if sizes is None else sizes
        capacity = max(sizes, default=0)
        graphs = MixedGraphs(self.model, MixedInputs(capacity, self.device),
                             SegmentBuffers.for_model(self.model, capacity, self.device), sizes, use_graphs,
                             self.num_kv_heads, self.num_sms)
        graphs.capture()
        return graphs

    def _graph_num_splits(self, batch: int) -> int:
        return choose_num_splits(batch, self.num_kv_heads, self.max_model_len, self.num_sms)

    def _decode_logits(self, input_ids, positions, meta) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions, meta))  # [B, V] fp32

    # -- KV pool sizing ----------------------------------------------------------
    def _size_kv_pool(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.device.type != "cuda":
            blocks = blocks_in_gib(self.config.cpu_kv_cache_gib, self.kv_shape)
            return self._holding_one_context(blocks, "cpu_kv_cache_gib")
        peak = self._profile_activation_bytes()
        free, total = torch.cuda.mem_get_info(self.device)
        used = torch.cuda.memory_allocated(self.device)
        blocks = num_blocks_for_memory(total, self.config.gpu_memory_utilization, used, peak, self.kv_shape)
        check_free_memory(blocks * self.kv_shape.bytes_per_block + peak, free, total, self.config.gpu_memory_utilization)
        if self.group is not None:  # every rank's pool holds the same block ids
            blocks = self.group.min_over_ranks(blocks)
        return self._holding_one_context(blocks, "gpu_memory_utilization")

    def _holding_one_context(self, blocks: int, size_option: str) -> int:
        return check_holds_context(blocks, self.block_size, self.max_model_len, size_option)

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

    # -- one step: launch, then collect -------------------------------------------------
    def execute(self, sched: SchedulerOutput) -> StepResult:
        """Run one step to the end (tests, scoring); the engine loop calls `launch` and `collect` apart."""
        return self.collect(self.launch(sched))

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput, after: LaunchedStep | None = None) -> LaunchedStep:
        """Pack the step's inputs and enqueue its forward pass and sampling; nothing here waits for the work
        it enqueues. Host-to-device copies from pageable memory (the eager path's packed inputs) wait for
        the stream, so they are made before this step's device work is enqueued.

        `after`: the step launched last, not collected yet, whose tokens are on the device (`feeds_next`);
        `sched` was scheduled ahead of them (`Scheduler.schedule_ahead`), and its sequences whose token is
        pending take it from there."""
        mask = sched.sample_mask()
        seqs = [s for s, needs in zip(sched.seqs, mask) if needs]
        feed = self._feed(sched, after) if after is not None else None
        if self._runs_graph(sched):
            if self.group is not None:
                self._share(StepKind.DECODE_GRAPH, sched, feed)
            return self._launch_graph(sched, mask, seqs, feed)
        if feed is not None and self.group is not None:
            raise RuntimeError("with tensor parallelism only a decode graph step takes the previous step's tokens")
        sampling = self._sampling(seqs)  # before the step's work: its copies from pageable memory would wait
        if feed is None and self.prefill_graphs is not None and self.prefill_graphs.can_run(sched):
            if self.group is not None:
                self._share(StepKind.PREFILL_GRAPH, sched)
            logits = self.prefill_graphs.run(sched.seqs[0], sched.num_new_tokens[0])
            return self._sampled_step(mask, seqs, self.sampler.sample(logits, sampling) if seqs else None)
        mixed = self.mixed_graphs is not None and self.mixed_graphs.can_run(sched.num_tokens)
        if self.group is not None:
            self._share(StepKind.MIXED_GRAPH if mixed else StepKind.EAGER, sched, sample=bool(seqs))
        # also when no sequence samples: a prompt chunk's KV must be written
        hidden, rows = self._run_mixed(sched, feed) if mixed else self._run_eager(sched, feed)
        if not seqs:
            return LaunchedStep(mask, None, None)
        return self._sampled_step(mask, seqs, self.sampler.sample(self.model.compute_logits(hidden[rows]), sampling))

    def _sampled_step(self, mask: list[bool], seqs: list[Sequence], sample: DeviceSample | None) -> LaunchedStep:
        """A launched step whose sampled tokens (of `seqs`) also go into the decode graphs' token buffer, for a
        next step launched before they are read back (one GPU: the other ranks of a tensor-parallel group
        sample nothing)."""
        graphs = self.graphs
        if sample is None or graphs is None or self.group is not None or len(seqs) > graphs.tokens.shape[0]:
            return LaunchedStep(mask, None, sample)
        if any(s.sampling.counts_tokens for s in seqs):  # its next step's penalties read this token on the host
            return LaunchedStep(mask, None, sample)
        graphs.tokens[:len(seqs)].copy_(sample.tokens)
        return LaunchedStep(mask, None, sample, feeds_next=True, token_seqs=seqs)

    def _run_mixed(self, sched: SchedulerOutput, feed: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states [T, H] and the rows to sample, on the piecewise graphs."""
        source = self.graphs.tokens if feed is not None else None
        return self.mixed_graphs.run(plan_step(sched, self.block_size, feed), source)

    def _run_eager(self, sched: SchedulerOutput, feed: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._prepare(sched, feed)
        return self._forward(batch), batch.sample_rows

    def _launch_graph(self, sched: SchedulerOutput, mask: list[bool], seqs: list[Sequence],
                      feed: list[int] | None) -> LaunchedStep:
        """A decode step on the graphs. Its tokens stay in `graphs.tokens`, so the next step can be launched on
        them before they are read back."""
        if seqs and all(_plain_greedy(s) for s in seqs):
            self.graphs.run(sched.seqs, feed)  # the graph's argmax: no sampler
            return LaunchedStep(mask, self.graphs.read_back(len(sched.seqs)), None, feeds_next=True,
                                token_seqs=sched.seqs)
        sampling = self._sampling(seqs)
        every_row = len(seqs) == len(sched.seqs)
        logits, _ = self.graphs.run(sched.seqs, feed)  # [n, V] fp32
        if not seqs:
            return LaunchedStep(mask, None, None)
        return self._sampled_step(mask, seqs, self.sampler.sample(logits if every_row else logits[self._rows(mask)],
                                                                  sampling))

    def _feed(self, sched: SchedulerOutput, after: LaunchedStep) -> list[int] | None:
        """For each sequence of `sched`, the row of `after`'s tokens that is its pending input token (-1 for
        those whose input is on the host); None when no sequence has one."""
        if not after.feeds_next:
            raise RuntimeError("the previous step's tokens are not on the device for this step to take")
        rows = {id(s): i for i, s in enumerate(after.token_seqs)}
        feed = [rows[id(s)] if s.has_pending_token else -1 for s in sched.seqs]
        return feed if max(feed, default=-1) >= 0 else None

    def collect(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step's tokens to reach the host. Their copies were enqueued at launch, right
        behind the step (`DecodeGraphs.read_back`, `DeviceSample`), so a step may be collected after the next
        one was launched, but before the one after that (two read-back buffers alternate)."""
        mask = step.mask
        if step.greedy_tokens is not None:
            (tokens,) = step.greedy_tokens.lists()  # the sync: waits for the replay and the copy
            if all(mask):
                return StepResult(tokens, SamplerOutput(token_ids=tokens))
            sampled = SamplerOutput(token_ids=[t for t, needs in zip(tokens, mask) if needs])
        else:
            sampled = step.sampled.to_host() if step.sampled is not None else None  # the sync
        if sampled is not None and len(sampled.token_ids) == len(mask):  # every sequence sampled
            return StepResult(list(sampled.token_ids), sampled)
        it = iter(sampled.token_ids if sampled else [])
        return StepResult([next(it) if needs else None for needs in mask], sampled)

    def _runs_graph(self, sched: SchedulerOutput) -> bool:
        return self.graphs is not None and self._is_decode_only(sched) and self.graphs.can_run(len(sched.seqs))

    def _sampling(self, seqs: list[Sequence]) -> SamplingBatch | None:
        if not seqs:
            return None
        params = [s.sampling for s in seqs]
        histories = [_history(s) for s in seqs] if any(p.adjusts_logits for p in params) else None
        return SamplingBatch.build(params, [self._generator(s) for s in seqs], self.model_config.vocab_size,
                                   self.device, histories, self.eos_token_ids)

    def _rows(self, mask: list[bool]) -> torch.Tensor:
        return torch.tensor([i for i, needs in enumerate(mask) if needs], device=self.device)

    @staticmethod
    def _is_decode_only(sched: SchedulerOutput) -> bool:
        return all(n == 1 for n in sched.num_new_tokens)

    def _forward(self, batch: StepInputs) -> torch.Tensor:
        return self.model(batch.input_ids, batch.positions, batch.meta)  # [T, H]

    @torch.inference_mode()
    def prefill_logits(self, seq: Sequence) -> torch.Tensor:
        """Logits at every prompt position of a sequence whose blocks are allocated (tests, scoring)."""
        sched = SchedulerOutput(seqs=[seq], num_new_tokens=[seq.num_uncomputed_tokens])
        if self.group is not None:
            self._share(StepKind.ALL_LOGITS, sched)
        return self.model.compute_logits(self._forward(self._prepare(sched)))

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.sampling.seed is None or seq.sampling.is_greedy:
            return None
        gen = self.generators.get(seq.request_id)
        if gen is None:
            gen = self.generators[seq.request_id] = seeded_generator(seq.sampling.seed, self.device)
        return gen

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
        if self.group is not None:
            self._released.append(request_id)

    def _prepare(self, sched: SchedulerOutput, feed: list[int] | None = None) -> StepInputs:
        source = self.graphs.tokens if feed is not None else None
        return pack_step(sched, self.block_size, self.device, self.num_kv_heads, self.num_sms, feed, source)

    # -- tensor parallel ------------------------------------------------------------------
    def _share(self, kind: StepKind, sched: SchedulerOutput, feed: list[int] | None = None,
               sample: bool = False) -> None:
        """Rank 0: the step's message to the other ranks, before its own work is enqueued."""
        released, self._released = tuple(self._released), []
        self.group.broadcast(step_message(kind, sched, feed, sample, released))

    @torch.inference_mode()
    def replay(self, kind: StepKind, sched: SchedulerOutput, feed: list[int] | None, sample: bool) -> None:
        """Ranks > 0: the device work rank 0 launches for the step, without sampling."""
        if kind is StepKind.DECODE_GRAPH:
            self.graphs.run(sched.seqs, feed)
        elif kind is StepKind.PREFILL_GRAPH:
            self.prefill_graphs.run(sched.seqs[0], sched.num_new_tokens[0])
        elif kind is StepKind.MIXED_GRAPH:
            hidden, rows = self._run_mixed(sched)
            if sample:
                self.model.compute_logits(hidden[rows])
        else:
            batch = self._prepare(sched)
            hidden = self._forward(batch)
            if kind is StepKind.ALL_LOGITS or sample:
                self.model.compute_logits(hidden if kind is StepKind.ALL_LOGITS else hidden[batch.sample_rows])


def context_length(config: EngineConfig, model_config: ModelConfig) -> int:
    return model_config.context_length(config.max_model_len)


def _plain_greedy(seq: Sequence) -> bool:
    return seq.sampling.is_greedy and seq.sampling.logprobs is None and not seq.sampling.adjusts_logits


def _history(seq: Sequence) -> TokenHistory:
    """What its penalties and min_tokens read. A sequence that counts tokens never has one pending here: a step
    that samples for it feeds no step launched ahead (`_sampled_step`)."""
    assert not (seq.has_pending_token and seq.sampling.counts_tokens)
    return TokenHistory(seq.prompt_ids, seq.output_counts or {}, seq.num_output_tokens)
