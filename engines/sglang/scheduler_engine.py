"""The step-level ``sglang`` engine: SGLang's own scheduler deciding each step.

SGLang 0.5.23's ``Scheduler`` (``sglang/srt/managers/scheduler.py``) runs on CPU
without a model for everything its cache path does: it is built here with
``object.__new__`` and SGLang's own ``init_*`` methods wherever they need no GPU, model
or process group, over the cache of the stateful ``sglang`` target
(:class:`~kvhit.engines.sglang.cache.SglangCacheEngine`: one ``UnifiedRadixCache``
with full KV, a window's KV and Mamba states). kvhit plays the model runner: each
step is SGLang's batch, and what the executor samples goes back as SGLang's
``GenerationBatchResult``. File:line below are in the sglang 0.5.23 wheel, under
``sglang/srt/``.

What runs is SGLang's own code, per step (``event_loop_normal``, scheduler.py:2026):

- :meth:`schedule`: ``Scheduler.get_next_batch_to_run`` (scheduler.py:3894): the
  chunked request's ``stash_chunked_request`` (``checkpoint_kv_cache``, which inserts
  the computed chunk into the tree and frees the window KV that left the window,
  ``common.py:75`` and ``unified_cache/components/swa.py:1033``), the merge of the
  last prefill into the running batch, then ``get_new_batch_prefill``: the policy,
  ``PrefillAdder`` (``schedule_policy.py:607``: ``add_chunked_req`` for the request
  being chunked, ``add_one_req`` for waiting ones, with ``init_next_round_input``'s
  match and Mamba copy-on-write), ``ScheduleBatch.prepare_for_extend`` (eviction and
  allocation); with no prefill, ``update_running_batch`` (``prepare_for_decode``, and
  retraction when the pools run short: a preemption).
- :meth:`executed`: ``SchedulerBatchResultProcessor.process_batch_result_prefill``
  or ``_decode`` (``scheduler_components/batch_result_processor.py:258``), which
  ``Scheduler.process_batch_result`` dispatches to (scheduler.py:5092-5101):
  sampled tokens appended, finish checks, ``checkpoint_kv_cache`` of a finished
  prefill, ``release_kv_cache`` (``common.py:400``) of a finished request.
- :meth:`abort`: ``Scheduler.abort_request`` (scheduler.py:5675): a waiting request
  leaves the queue; a request being chunked is released at the next step's
  ``process_pending_chunked_abort`` (scheduler.py:3778) without caching its chunk;
  a running one gets ``to_finish`` and is released by its next step's result.

Not SGLang's, and why (each the part a model, a GPU or a server would give):

- the model runner: no forward runs. SGLang reads from it the attention backend's
  tile size (none: its fallback of 64, scheduler.py:4166) and whether it is
  "prefill-aware SWA" (no); the Mamba copy-on-write a hit stages
  (``mamba_cow_src_indices``, schedule_batch.py:3240) is the forward's, so the
  step reads the tree's state itself (the table names it at the hit);
- the model config: a namespace with the fields this path reads (vocabulary, no
  encoder, no reasoning tokens);
- process groups: ranks 0 stated through SGLang's ``get_parallel()``
  (``override_permanently``), one micro-batch of :data:`~kvhit.engines.sglang.cache.ROWS` requests;
- the metrics and load reports ``process_batch_result`` sends around the dispatch
  (scheduler.py:5082-5088, 5108-5118) are not sent; the detokenizer is a sink.

A rid is ``r<request>.``: SGLang aborts every request whose rid *starts with* the
aborted one (scheduler.py:5688), so ``r1`` would abort ``r10``.

Block ids are the stateful ``sglang`` engine's (full KV pages, window KV pages and
Mamba state slots in one id space). A Mamba table names the state a step reads at
``computed - 1`` (the tree's state at a hit, else the request's own slot) and the
request's own slot at ``end - 1``, which the step writes. When SGLang caches a
Mamba state it copies the request's slot into a new one for the tree
(``components/mamba.py:677``, ``MambaPool.copy_from``); the next plan lists those
copies (``StepPlan.copies``), recorded from SGLang's own calls.

    >>> from kvhit.model.spec import Group
    >>> from kvhit.contract import Ran, StepResult
    >>> engine = SglangSchedulerEngine(
    ...     EngineConfig((Group("full", 1),), num_blocks=16, alignment=1, budget=4))
    >>> engine.arrive(0, [1, 2, 3, 4, 5, 6], max_new=1)
    >>> [(s.computed, s.new, s.hit) for s in engine.schedule().scheduled]
    [(0, 4, 0)]
    >>> engine.executed(StepResult((Ran(0, ()),)))
    ()
    >>> [(s.computed, s.new, s.hit) for s in engine.schedule().scheduled]
    [(4, 2, None)]
    >>> engine.executed(StepResult((Ran(0, (7,)),)))
    (0,)
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import torch

from kvhit.contract import (
    Capabilities,
    EngineConfig,
    Scheduled,
    Snapshot,
    StepLoop,
    StepPlan,
    StepResult,
)
from kvhit.engines.sglang.cache import MODEL, ROWS, SglangCacheEngine
from kvhit.engines.sglang.target import _SERVER_ARGS
from kvhit.errors import Unsupported
from kvhit.model.spec import Kind

# isort: split
# After kvhit.engines.sglang.target, which prepares SGLang's imports and server args.
from sglang.srt.constrained.grammar_manager import GrammarManager
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.utils import GenerationBatchResult, validate_input_length
from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
    NgramEmbeddingManager,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

MAX_PREFILL_TOKENS = 16384  # SGLang's default --max-prefill-tokens (arg_groups/fields/schedule.py)
SCHEDULER_MODEL = SimpleNamespace(
    **vars(MODEL),
    is_multimodal=False,
    hf_eos_token_id=None,
    self_opened_think_start_ids=None,
    think_end_ids=None,
)
"""What this path reads of SGLang's ``ModelConfig`` (the cache engine's, and more)."""

RANKS = dict(pp_rank=0, tp_rank=0, attn_tp_rank=0, attn_cp_rank=0, attn_dp_rank=0, dp_rank=0)


class Sink:
    """Where SGLang sends what would go to its tokenizer, detokenizer and metrics
    sockets."""

    def send_output(self, *args: Any, **kwargs: Any) -> None:
        """Drop it."""


def rid(request: int) -> str:
    """SGLang's rid of kvhit's request (no rid a prefix of another's).

    >>> rid(1), rid(10)
    ('r1.', 'r10.')
    """
    return f"r{request}."


def new_scheduler(cache: Any, budget: int | None) -> Any:
    """SGLang's ``Scheduler`` over ``cache``, chunking prefills at ``budget`` tokens
    (None: no chunking), with what its step loop reads and nothing else (see the
    module docstring)."""
    get_parallel().override_permanently(**RANKS, pp_max_micro_batch_size=ROWS)
    s: Any = object.__new__(Scheduler)
    s.server_args = _SERVER_ARGS
    s.tree_cache = cache
    s.req_to_token_pool = cache.req_to_token_pool
    s.token_to_kv_pool_allocator = cache.token_to_kv_pool_allocator
    s.page_size = cache.page_size
    s.model_config = SCHEDULER_MODEL
    s.device = "cpu"
    allocator = s.token_to_kv_pool_allocator
    # a hybrid's token count is its full pool's (model_executor/pool_configurator.py:896)
    s.max_total_num_tokens = s.full_tokens_per_layer = getattr(
        allocator, "size_full", allocator.size
    )
    s.swa_tokens_per_layer = getattr(allocator, "size_swa", allocator.size)
    context = cache.req_to_token_pool.req_to_token.shape[1]
    s.max_req_len = min(context - 1, s.max_total_num_tokens - 1)  # tp_worker.py:568-572
    s.max_req_input_len = s.max_req_len - 5
    s.max_new_tokens_limit = None
    s.sliding_window_size = cache.sliding_window_size if cache.supports_swa() else None
    s.kv_shard_widening = 1
    s.is_hybrid_swa = cache.supports_swa()
    s.is_hybrid_ssm = cache.supports_mamba()
    s.is_generation = True
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.disaggregation_mode = DisaggregationMode.NULL
    s.dllm_config = s.hisparse_coordinator = s.decode_offload_manager = None
    s.draft_worker = s.model_worker = s.rust_server = s.load_snapshot_writer = None
    s.min_free_slots_delayer = s.dynamic_chunk_sizer = s.truncation_align_size = None
    s.scheduler_stage_metrics = None  # the stage recorder's disabled form
    for flag in ("enable_hisparse", "enable_lmcache", "enable_hicache_storage", "enable_lora",
                 "enable_hierarchical_cache", "enable_unified_cache_external_linker",
                 "enable_priority_scheduling", "schedule_low_priority_values_first",
                 "enable_overlap", "enable_overlap_mlx", "require_mlp_sync", "is_mixed_chunk",
                 "enable_metrics", "enable_fpm"):  # fmt: skip
        setattr(s, flag, False)
    s.schedule_policy = "fcfs"
    s.chunked_prefill_size = budget
    s.max_prefill_tokens = MAX_PREFILL_TOKENS
    s.max_running_requests = ROWS
    s.max_queued_requests = None
    s.priority_scheduling_preemption_threshold = 10
    s.chunked_req = s._pending_chunked_abort_req = None
    s.prefill_decode_interval = s._prefill_decode_interval_remaining = 0
    s.processed_tokens_counter = 0
    s.tp_worker = SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=None, prefill_aware_swa=False)
    )
    s.ngram_embedding_manager = NgramEmbeddingManager(enabled=False, table=None, n=0)
    s.weight_updater = SimpleNamespace(offload_tags=set())
    s.dp_tp_cpu_group = s.pp_group = s.mm_receiver = None
    s.dp_tp_group = SimpleNamespace(world_size=1, first_rank=0, is_first_rank=True)
    s.ipc_channels = SimpleNamespace(
        send_to_detokenizer=Sink(), send_to_tokenizer=Sink(), send_metrics_from_scheduler=Sink()
    )
    s.future_map = s.spec_algorithm.create_future_map(
        "cpu", s.req_to_token_pool, needs_cpu_seq_lens=False, needs_confidence_relay=False
    )
    s.init_running_status()
    s.init_metrics_collector()
    s.init_metrics_reporter()
    s.init_schedule_policy()
    s.grammar_manager = GrammarManager(s)
    s.init_pool_stats_observer()
    s.init_load_inquirer()
    s.init_load_publisher()
    s.init_kv_events_publisher()
    s.init_dp_attn_adapter()
    s.init_output_streamer()
    s.init_batch_result_processor()
    return s


@dataclass
class SglangRequest:
    """What the engine knows of a request SGLang runs: its ``Req``, and whether its
    next step is the one that (re)starts it (after arrival or a retraction)."""

    req: Any
    fresh: bool = True


@dataclass
class Copies:
    """The Mamba state copies SGLang made (source, destination slot), recorded from
    its own ``MambaPool.copy_from`` calls."""

    made: list[tuple[int, int]] = field(default_factory=list)

    def record(self, pool: Any) -> None:
        """Record every copy ``pool`` makes from now on."""
        original = pool.copy_from

        def copy_from(src: torch.Tensor, dst: torch.Tensor) -> Any:
            self.made += zip(src.view(-1).tolist(), dst.view(-1).tolist(), strict=True)
            return original(src, dst)

        pool.copy_from = copy_from

    def take(self) -> list[tuple[int, int]]:
        """The copies made since the last call."""
        made, self.made = self.made, []
        return made


class SglangSchedulerEngine:
    """SGLang's scheduler as a :class:`~kvhit.contract.StepEngine` (see the module
    docstring)."""

    capabilities: Capabilities = replace(
        SglangCacheEngine.capabilities, loop=StepLoop(cuts=False, asynchronous=False)
    )
    """The stateful ``sglang`` engine's configurations; steps run in order, each
    reported before the next is scheduled (SGLang's overlap loop is not driven), and
    none is cut (SGLang has no step that is scheduled and never runs: a forward runs
    its whole batch)."""

    def __init__(self, config: EngineConfig):
        if config.asynchronous:
            raise Unsupported("SGLang's overlap scheduling (event_loop_overlap) is not driven")
        self.tree = SglangCacheEngine(config)
        page = self.tree.tree.page
        if config.budget is not None and config.budget % page:
            raise Unsupported(
                f"SGLang refuses a chunked prefill size ({config.budget}) that is no multiple "
                f"of its page size ({page}) (arg_groups/validation_hook.py:244)"
            )
        self.groups = config.groups
        self.scheduler = new_scheduler(self.tree.cache, config.budget)
        self.copies = Copies()
        if self.tree.tree.mamba_index is not None:
            self.copies.record(self.tree.cache.req_to_token_pool.mamba_pool)
        self.requests: dict[int, SglangRequest] = {}  # kvhit's requests not over
        self.known: dict[int, SglangRequest] = {}  # and the aborted ones SGLang still holds
        self.batches: list[Any] = []  # the batches scheduled and not yet reported

    # --- requests -------------------------------------------------------------------

    def arrive(self, request: int, prompt: Sequence[int], max_new: int) -> None:
        """Queue the request as SGLang's scheduler takes a new one
        (``_handle_generate_request``, scheduler.py:3243-3252): its ``max_new`` clipped
        to what its pools can hold (``init_req_max_new_tokens``, scheduler.py:2693, so
        SGLang may finish it sooner), and refused (Unsupported) where SGLang refuses it
        (a prompt of ``max_req_input_len`` tokens or more: the pool's size less 6,
        tp_worker.py:568-572, or one its memory cannot hold)."""
        params = SamplingParams(max_new_tokens=max_new)
        params.normalize(None)
        req = Req(rid(request), "", array("q", prompt), params)
        s = self.scheduler
        s.init_req_max_new_tokens(req)
        error = validate_input_length(req, s.max_req_input_len, allow_auto_truncate=False)
        if error or req.to_finish is not None:
            raise Unsupported(f"SGLang refuses the request: {error or req.to_finish.message}")
        self.requests[request] = self.known[request] = SglangRequest(req)
        s._add_request_to_queue(req)

    def abort(self, request: int) -> None:
        """SGLang's ``abort_request``; the request is over for kvhit."""
        started = self.requests.pop(request)
        if started.req in self.scheduler.waiting_queue:  # SGLang drops it at once
            del self.known[request]
        self.scheduler.abort_request(AbortReq(rid=rid(request)))

    # --- steps ----------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """SGLang's ``get_next_batch_to_run``, as its loop calls it."""
        s = self.scheduler
        waiting = {id(req) for req in s.waiting_queue}
        plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        s.last_batch = batch
        preempted = tuple(
            r for r, started in self.requests.items()
            if not started.fresh and id(started.req) not in waiting
            and started.req in s.waiting_queue
        )  # fmt: skip
        for r in preempted:
            self.requests[r].fresh = True
        copies = tuple(self.ids_of_states(self.copies.take()))
        self.batches.append(batch)
        if batch is None:
            return StepPlan((), preempted, copies)
        parts = [self.scheduled(batch, r) for r in self.running(batch)]
        live = tuple(s for s in parts if s.request in self.requests)
        draining = tuple(s for s in parts if s.request not in self.requests)
        return StepPlan(live, preempted, copies, draining)

    def running(self, batch: Any) -> list[int]:
        """kvhit's requests in ``batch``, the aborted ones among them: SGLang runs a
        running request's next step after its abort (``to_finish``,
        scheduler.py:5799) and frees it with that step's result."""
        ours = {id(started.req): r for r, started in self.known.items()}
        return [ours[id(req)] for req in batch.reqs if id(req) in ours]

    def scheduled(self, batch: Any, request: int) -> Scheduled:
        """One request's part of ``batch``."""
        started = self.known[request]
        req = started.req
        if batch.forward_mode.is_decode():
            computed, new = len(req.origin_input_ids) + len(req.output_ids) - 1, 1
        else:
            computed, new = req.prefix_len, req.extend_end - req.prefix_len
        hit = computed if started.fresh else None
        tables = self.tables(batch, req, computed, computed + new, started.fresh)
        started.fresh = False
        return Scheduled(request, computed, new, tables, hit)

    def tables(
        self, batch: Any, req: Any, computed: int, end: int, fresh: bool
    ) -> tuple[tuple[int | None, ...], ...]:
        """The request's block tables through ``end``, off its row of
        ``req_to_token``."""
        page = self.tree.tree.page
        row = self.scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :end:page]
        starts = row.tolist()
        out: list[tuple[int | None, ...]] = []
        for g in self.groups:
            if g.kind == Kind.FULL:
                out.append(tuple(slot // page for slot in starts))
            elif g.kind == Kind.SLIDING_WINDOW:
                mapping = self.scheduler.token_to_kv_pool_allocator.full_to_swa_index_mapping
                window = [int(mapping[slot]) for slot in starts]
                out.append(tuple(self.tree.window_id(w) if w > 0 else None for w in window))
            else:
                out.append(self.states(batch, req, computed, end, fresh))
        return tuple(out)

    def states(
        self, batch: Any, req: Any, computed: int, end: int, fresh: bool
    ) -> tuple[int | None, ...]:
        """A Mamba table: the state read at ``computed - 1`` (at a hit, the tree's
        state the forward copies in, else the request's own slot), the request's own
        slot at ``end - 1``, which the step writes."""
        own = int(req.kv.mamba_pool_idx.view(-1)[0])
        states: list[int | None] = [None] * end
        if computed:
            states[computed - 1] = self.tree.state_id(self.cow_source(batch, own) if fresh else own)
        states[end - 1] = self.tree.state_id(own)
        return tuple(states)

    @staticmethod
    def cow_source(batch: Any, own: int) -> int:
        """The slot the batch's copy-on-write copies into slot ``own``
        (``ScheduleBatch._collect_deferred_mamba_cow_and_clear``,
        schedule_batch.py:3240); ``own`` if none (a restart that kept its state)."""
        if batch.mamba_cow_src_indices is None:
            return own
        dst = batch.mamba_cow_dst_indices.view(-1).tolist()
        if own not in dst:
            return own
        return int(batch.mamba_cow_src_indices.view(-1)[dst.index(own)])

    def ids_of_states(self, copies: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Mamba slot copies as block ids."""
        return [(self.tree.state_id(a), self.tree.state_id(b)) for a, b in copies]

    def executed(self, result: StepResult) -> tuple[int, ...]:
        """SGLang's result processing of the oldest batch: the executor's sampled
        tokens as its ``GenerationBatchResult``; the requests it finished."""
        batch = self.batches.pop(0)
        if batch is None:  # a step that ran nothing
            return ()
        sampled = {ran.request: ran.sampled for ran in result.ran}
        ours = {id(started.req): r for r, started in self.known.items()}
        tokens = [next(iter(sampled.get(ours.get(id(req), -1), ())), 0) for req in batch.reqs]
        output = GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64))
        processor = self.scheduler.batch_result_processor
        if batch.forward_mode.is_decode():
            processor.process_batch_result_decode(batch, output)
        else:
            processor.process_batch_result_prefill(batch, output)
        self.scheduler.tree_cache.flush_pending_backups()
        over = [r for r, started in self.known.items() if started.req.finished()]
        for r in over:
            del self.known[r]
        done = tuple(r for r in over if self.requests.pop(r, None) is not None)
        return done

    # --- the cache ------------------------------------------------------------------

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """What SGLang's tree holds of ``tokens`` (the stateful engine's reading)."""
        return self.tree.snapshot(tokens)
