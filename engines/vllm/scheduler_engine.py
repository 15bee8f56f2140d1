"""The ``vllm-scheduler`` target: vLLM's own scheduler step loop as a
:class:`~kvhit.contract.StepEngine` (docs/design.md §5.7).

The engine is vLLM's real ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) or, with
:attr:`~kvhit.contract.EngineConfig.asynchronous`, its ``AsyncScheduler``
(``async_scheduler.py``), built on CPU as the ``vllm-connector`` target builds it
(:func:`kvhit.engines.vllm.connector_lookup.make_scheduler`, the ``vllm`` target's
specs, no KV connector) for the configuration's groups and a pool of ``num_blocks``
blocks plus vLLM's null block. kvhit plays the model executor: vLLM decides every step,
kvhit runs it and reports what it sampled. Read in vLLM 0.34.0:

- ``arrive(r, prompt, max_new)``: vLLM's ``Request`` (``v1/request.py``) of the prompt,
  hashed by vLLM's block hasher, ``SamplingParams(max_tokens=max_new,
  ignore_eos=True)``, handed to ``Scheduler.add_request``.
- ``abort(r)``: ``Scheduler.finish_requests(r, RequestStatus.FINISHED_ABORTED)``; its
  blocks are freed (and stay cached) at once.
- ``schedule()``: ``Scheduler.schedule()``, read as a :class:`~kvhit.contract.StepPlan`:
  for each request in the output's ``num_scheduled_tokens`` (running ones first, then
  those (re)started), :class:`~kvhit.contract.Scheduled` with ``computed`` the request's
  ``num_computed_tokens`` before the step (vLLM advances it in
  ``_update_after_schedule``, inside ``schedule()``), ``new`` its scheduled tokens
  less its scheduled spec tokens, ``tables`` its block ids per group after scheduling
  (``KVCacheManager.get_block_ids``; vLLM's null block is None) and ``hit`` set where
  the step (re)starts it: a request in ``scheduled_new_reqs`` (in 0.34.0 a resumed one
  too) or in ``scheduled_cached_reqs.resumed_req_ids`` (0.14.0-0.32.0), whose
  ``computed`` is then the prefix hit ``schedule()`` gave it. ``preempted`` is the
  output's ``preempted_req_ids`` (every release from 0.14.0).
- ``executed(result)``: the oldest scheduler output not yet reported (a FIFO: with
  ``AsyncScheduler``, the harness schedules step n + 1 before it reports step n, as
  vLLM's ``EngineCore.step_with_batch_queue`` does) is answered with a
  ``ModelRunnerOutput`` (``v1/outputs.py``) holding, in the output's order, the tokens
  each request sampled (none for a prompt chunk), and ``update_from_output`` runs. A
  request the result says was *cut* (its part of the step never ran) is aborted first,
  as vLLM's ``EngineCore`` aborts a request while its step executes
  (``_process_aborts_queue`` before ``update_from_output``): vLLM then sees a finished
  request in the output and skips it ("the request is aborted while the model is
  executing it"); the blocks it published when the step was scheduled stay cached,
  though the step never wrote them. The answer is the requests that finished
  (``EngineCoreOutput.finish_reason`` ``length`` or ``stop``).
- ``snapshot(tokens)``: vLLM's block pool looked up group by group
  (:func:`kvhit.engines.vllm.manager.pool_rows`), partial entries where the
  coordinator reads them (partial hash hits).

The configuration, as vLLM would run the model (:func:`kvhit.engines.vllm.connector_lookup.vllm_config`):
``budget`` is ``max_num_batched_tokens`` with chunked prefill on (so a long prompt is
computed over several steps; vLLM's default otherwise); the pool of ``num_blocks`` is
what makes vLLM preempt (``Scheduler._preempt_request``: the last running request is
freed and goes back to the waiting queue); a Mamba group is cached in ``align`` mode
(``CacheConfig.mamba_cache_mode``, 0.16.0+), where ``schedule()`` splits a prefill at
Mamba block boundaries (``_mamba_block_aligned_split``) so that a state exists where it
is cached. 0.14.0 and 0.15.0 have no cache modes: Mamba prefix caching is vLLM's
experimental one (``MambaModelConfig.verify_and_update_config``), whose scheduler splits
no prefill at a Mamba block boundary, yet the manager caches a state at every block
boundary a chunk passes over (a budget of 3 and a prompt of 10 tokens: chunks end at
3, 6, 9 and 10, and a later request hits 8 in the Mamba group); the gate judges it.
vLLM's own refusals are ``unsupported``: a Mamba block wider than the budget in
``align`` mode (``VllmConfig.validate_block_size``, 0.19.0-0.26.0; from 0.27.0 a chunk
advances inside a wide block), asynchronous scheduling with Mamba prefix caching
(0.16.0).

Releases: every one from 0.14.0 (the oldest kvhit drives,
:func:`kvhit.engines.vllm.release.detect`) to 0.34.0. Up to 0.19.0 vLLM's scheduler
takes no ``hash_block_size`` and hashes at its block size, so every group's block must
be that size (:func:`hashed_at_block_size`); up to 0.32.0 a resumed request is in
``scheduled_cached_reqs.resumed_req_ids`` and ``ModelRunnerOutput`` takes
``req_id_to_index``; every release has ``AsyncScheduler`` and the output's
``preempted_req_ids``.

What it declares (:data:`SCHEDULER_CAPABILITIES`): what vLLM's ``KVCacheManager`` can be
driven with (:func:`kvhit.engines.vllm.release.manager_capabilities`: the scheduler
builds the same manager) without drafters and without tiers, and its loop
(:class:`~kvhit.contract.StepLoop`): asynchronous or not, no cut steps (vLLM publishes a
block's hash when the step that writes it is scheduled, ``KVCacheManager.allocate_slots``
→ ``cache_blocks``, and relies on every scheduled step running; a cut the engine is
handed anyway is the abort above), no load failures (no connector yet). No drafter: a drafter of
kvhit's model (an eagle drop, lookahead hashes) is a speculative config of a draft
model (``SpeculativeConfig``: EAGLE/MTP read the draft model's config), which this
engine does not load.

    >>> from kvhit.contract import EngineConfig, Ran, StepResult
    >>> from kvhit.model.spec import Group
    >>> engine = VllmSchedulerEngine(
    ...     EngineConfig((Group("full", 2),), num_blocks=8, alignment=2, budget=4))
    >>> engine.arrive(0, [5, 6, 7, 8, 9, 10], max_new=1)
    >>> engine.schedule().scheduled
    (Scheduled(request=0, computed=0, new=4, tables=((1, 2),), hit=0, drafts=0, loaded=()),)
    >>> engine.executed(StepResult((Ran(0, ()),)))
    ()
    >>> engine.schedule().scheduled[0].tables
    ((1, 2, 3),)
    >>> engine.executed(StepResult((Ran(0, (11,)),)))
    (0,)
    >>> engine.snapshot([5, 6, 7, 8, 9, 10, 11])
    Snapshot(cached=((True, True, True),), tiers=())
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvhit.contract import (
    Capabilities,
    EngineConfig,
    Rule,
    Scheduled,
    Snapshot,
    StepFactory,
    StepLoop,
    StepPlan,
    StepResult,
)
from kvhit.engines.vllm.options import InFlightAborts
from kvhit.engines.vllm.release import (
    MAX_MODEL_LEN,
    import_failure,
    manager_capabilities,
    scheduler_block_size,
)
from kvhit.errors import BadInput, Unsupported
from kvhit.model.spec import Kind, Query

try:
    from vllm.config import CacheConfig
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import FinishReason
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    from kvhit.engines.vllm.connector_lookup import make_scheduler, vllm_config
    from kvhit.engines.vllm.manager import new_request, pool_rows
    from kvhit.engines.vllm.target import RELEASE, partial_hits_on
except ImportError as err:
    raise import_failure(err) from None

from kvhit.engines.vllm.compat import accepted, takes

HASHES_AT_BLOCK_SIZE = not takes(Scheduler.__init__, "hash_block_size")
"""Whether the installed release's scheduler hashes requests at its block size: its
``Scheduler`` takes no ``hash_block_size`` (0.14.0-0.19.0) and hands the scheduler
block size to the ``KVCacheManager`` as the hash block size."""


def hashed_at_block_size(q: Query) -> str | None:
    """Where vLLM's scheduler hashes at its block size (:data:`HASHES_AT_BLOCK_SIZE`),
    every group's block must be that size (a finer block has no hash of its own)."""
    if not HASHES_AT_BLOCK_SIZE:
        return None
    block = scheduler_block_size(q)
    if any(g.block_size != block for g in q.groups) or q.hash_unit not in (None, block):
        return (
            f"vLLM {RELEASE.name}'s scheduler hashes at its block size ({block}; "
            "Scheduler takes no hash_block_size): every group's block must be that size"
        )
    return None


def states_inside_blocks(q: Query) -> str | None:
    """A Mamba block larger than the hash unit keeps states at the hash unit inside a
    block, which vLLM's model runner copies between state blocks as the scheduler tells
    it (align mode); kvhit's executor writes a state only at a step's last token and
    does not make those copies, so such a configuration is not driven here."""
    unit = q.hash_unit
    if unit is not None and any(g.kind == Kind.MAMBA and g.block_size > unit for g in q.groups):
        return (
            "a Mamba block larger than the hash unit: the model runner's state copies "
            "inside a block are not modelled by kvhit's executor"
        )
    return None


ALIGN_MODE = takes(CacheConfig, "mamba_cache_mode")
"""Whether the installed release's ``CacheConfig`` has ``mamba_cache_mode`` (0.16.0+),
so Mamba states are cached in ``align`` mode: chunks split at block ends, the state
written at a chunk's end."""


def without_align_mode(q: Query) -> str | None:
    """Before ``align`` mode, which Mamba states vLLM's model runner writes inside a
    chunk (the chunk's end only, or every block end) is not read here, so kvhit's
    executor cannot say what a Mamba block holds: not driven. (Driven as if only the
    chunk's end were written, 0.14.0 caches a block a chunk passes over and a later
    request reads it: a candidate, not a finding.)"""
    if ALIGN_MODE or not any(g.kind == Kind.MAMBA for g in q.groups):
        return None
    return f"vLLM {RELEASE.name} has no mamba_cache_mode: its Mamba states inside a chunk are not modelled"


SCHEDULER_CAPABILITIES: Capabilities = replace(
    manager_capabilities(RELEASE), drafters=frozenset(), tiers=False, loop=StepLoop(cuts=False)
).with_rules(
    Rule(hashed_at_block_size.__name__, hashed_at_block_size),
    Rule(states_inside_blocks.__name__, states_inside_blocks),
    Rule(without_align_mode.__name__, without_align_mode),
)
"""What the ``vllm-scheduler`` target can be driven with on the installed release
(module docstring)."""

FINISHED = frozenset({FinishReason.LENGTH, FinishReason.STOP})
"""The finish reasons of a request that generated all its tokens (an abort or an
error is not finishing)."""


class VllmSchedulerEngine:
    """vLLM's scheduler step loop as a :class:`~kvhit.contract.StepEngine` (module
    docstring); a :data:`~kvhit.contract.StepFactory` of itself."""

    capabilities = SCHEDULER_CAPABILITIES

    def __init__(self, config: EngineConfig):
        shape = config.as_query(1)
        reason = self.capabilities.refusal(shape)
        if reason is not None:
            raise Unsupported(reason)
        self.groups = config.groups
        mamba = any(g.kind == Kind.MAMBA for g in self.groups)
        budget = MAX_MODEL_LEN if config.budget is None else config.budget
        cls = AsyncScheduler if config.asynchronous else Scheduler
        try:
            settings = vllm_config(
                scheduler_block_size(shape), mamba, None, budget, config.asynchronous
            )
            validated(settings)
        except (AssertionError, ValueError) as err:  # vLLM's validation (pydantic's too)
            raise Unsupported(f"vLLM {RELEASE.name} refuses this configuration: {err}") from None
        self.scheduler = make_scheduler(shape, config.num_blocks + 1, settings, cls)
        manager = self.scheduler.kv_cache_manager
        self.pool = manager.block_pool
        self.null = self.pool.null_block.block_id
        self.partial_hits = partial_hits_on(manager.coordinator)
        self.hasher = get_request_block_hasher(self.pool.hash_block_size, sha256)
        self.pending: deque[SchedulerOutput] = deque()

    def arrive(self, request: int, prompt: Sequence[int], max_new: int) -> None:
        """Add vLLM's request of ``prompt`` generating ``max_new`` tokens;
        :class:`Unsupported` past vLLM's ``max_model_len``."""
        if len(prompt) + max_new > MAX_MODEL_LEN:
            raise Unsupported(f"longer than max_model_len ({MAX_MODEL_LEN})")
        self.scheduler.add_request(new_request(str(request), prompt, self.hasher, max_new))

    def abort(self, request: int) -> None:
        """Finish the request as aborted (its blocks freed, its cached blocks kept)."""
        self.scheduler.finish_requests(str(request), RequestStatus.FINISHED_ABORTED)

    def schedule(self) -> StepPlan:
        """vLLM's next step (module docstring)."""
        output = self.scheduler.schedule()
        self.pending.append(output)
        cached = output.scheduled_cached_reqs
        restarted = {new.req_id for new in output.scheduled_new_reqs}
        restarted |= set(getattr(cached, "resumed_req_ids", ()))
        scheduled = tuple(
            self.scheduled(req_id, tokens, output, req_id in restarted)
            for req_id, tokens in output.num_scheduled_tokens.items()
        )
        preempted = tuple(sorted(int(r) for r in output.preempted_req_ids or ()))
        return StepPlan(scheduled, preempted)

    def scheduled(
        self, req_id: str, tokens: int, output: SchedulerOutput, restarted: bool
    ) -> Scheduled:
        """Request ``req_id``'s part of the step ``output``: ``tokens`` scheduled, the
        step (re)starting it or not."""
        request = self.scheduler.requests[req_id]
        drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
        computed = request.num_computed_tokens - tokens
        tables = tuple(
            tuple(None if b == self.null else b for b in ids)
            for ids in self.scheduler.kv_cache_manager.get_block_ids(req_id)
        )
        hit = computed if restarted else None
        return Scheduled(int(req_id), computed, tokens - drafts, tables, hit, drafts)

    def executed(self, result: StepResult) -> tuple[int, ...]:
        """Report the oldest step not yet reported (module docstring): the cut
        requests aborted, then ``update_from_output``; the requests that finished.
        :class:`BadInput` if no step is waiting, or ``result`` names a request the step
        did not schedule."""
        if not self.pending:
            raise BadInput("executed: no scheduled step is waiting for its result")
        output = self.pending.popleft()
        step = output.num_scheduled_tokens
        named = [r.request for r in result.ran] + list(result.cut)
        stray = sorted({r for r in named if str(r) not in step})
        if stray:
            raise BadInput(f"executed: request {stray[0]} was not scheduled in this step")
        cut = [str(r) for r in result.cut]
        if cut:
            self.scheduler.finish_requests(cut, RequestStatus.FINISHED_ABORTED)
        outputs = self.scheduler.update_from_output(output, runner_output(step, result))
        return tuple(
            int(out.request_id)
            for client in outputs.values()
            for out in client.outputs
            if out.finish_reason in FINISHED
        )

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """What vLLM's block pool holds of ``tokens``, group by group."""
        hashes = new_request("snapshot", tokens, self.hasher).block_hashes
        return Snapshot(pool_rows(self.pool, self.groups, hashes, self.partial_hits))


def validated(settings: Any) -> None:
    """Validate the config's block size as vLLM's ``EngineCore`` does once it is final
    (``VllmConfig.validate_block_size``, 0.19.0+; in 0.20.0-0.26.0 it asserts that a
    Mamba block in ``align`` mode fits the token budget, below which
    ``_mamba_block_aligned_split`` schedules nothing)."""
    validate = getattr(settings, "validate_block_size", None)
    if validate is not None:
        validate()


def runner_output(step: dict[str, int], result: StepResult) -> Any:
    """The ``ModelRunnerOutput`` of a step whose scheduled tokens per request are
    ``step``: the requests not cut, in the step's order, each with the tokens it
    sampled (none if ``result`` lists none for it: a prompt chunk), and the index of
    each request where the release has ``req_id_to_index`` (up to 0.32.0)."""
    sampled = {str(ran.request): list(ran.sampled) for ran in result.ran}
    cut = {str(r) for r in result.cut}
    ids = [r for r in step if r not in cut]
    index = {"req_id_to_index": {r: i for i, r in enumerate(ids)}}
    return ModelRunnerOutput(
        req_ids=ids,
        sampled_token_ids=[sampled.get(r, []) for r in ids],
        **accepted(ModelRunnerOutput, index),
    )


class AbortedInFlight(VllmSchedulerEngine):
    """:class:`VllmSchedulerEngine` under an executor that may drop an aborted
    request's part of a step in flight (``--option cuts=drop``): the same engine, whose
    loop now declares cuts."""

    capabilities = replace(SCHEDULER_CAPABILITIES, loop=StepLoop(cuts=True))


def vllm_scheduler_engine(options: Mapping[str, str]) -> StepFactory:
    """The ``vllm-scheduler`` built-in for the target's ``options``: its steps are never
    cut (``cuts=run``, vLLM's model runner runs what was scheduled), or may be
    (``cuts=drop``)."""
    if options.get("cuts", str(InFlightAborts.RUN)) == InFlightAborts.DROP:
        return AbortedInFlight
    return VllmSchedulerEngine
