"""The stateful ``vllm-connector`` target: vLLM's scheduler serving a program, its pool
spilling evicted blocks to an offload store that kvhit's connector restores from.

The engine is vLLM's real ``Scheduler`` with kvhit's connector
(:func:`kvhit.engines.vllm.connector_lookup.build_scheduler`), its pool of ``num_blocks`` blocks
(plus vLLM's null block). The program's store (at most one: the configuration's
:class:`~kvhit.contract.Store`, its kinds and ``num_blocks`` slots) is the connector's
(:class:`SlotStore`): whenever vLLM's block pool evicts a cached block
(``BlockPool._maybe_evict_cached_block``, observed and called through), each key the
block was cached under (a block hash with its group) whose group's kind the store holds
is spilled to a slot (its own, a free one, or the one spilled to longest ago that the
admitted request does not use), and the admit reports the spill; the content ledger
(:mod:`kvhit.harness.ledger`) follows the content.

``admit(r, tokens)``: the connector is handed the store's rows for these tokens as a
tiered query (:func:`store_query`: the pool's own rows empty, since the connector
cannot see the pool), vLLM's ``Request`` is added and ``Scheduler.schedule()`` runs
until the prompt is computed (vLLM may split a Mamba prefill at its block boundaries;
the running requests have nothing left to compute, so nothing else is scheduled; a
split prefill that cannot go on in the pool is ``rejected``, :meth:`VllmOffloadEngine.stalled`).
Everything on the way is vLLM's: the local lookup, the connector path of the release
(:class:`kvhit.engines.vllm.connector_lookup.ConnectorPath`), allocation, eviction, caching. The
answer is the hit (local + external tokens), the blocks taken from the pool and from
the store, the tables as they stood for the prefill (:meth:`VllmOffloadEngine.tables`),
and the moves: the spills made during the admit, then the restores, the blocks the
connector loads (:func:`loaded_blocks`) at their table entries, each from the slot of
its key. Then, as the ``vllm`` stateful target does, ``remove_skipped_blocks`` drops
the blocks that left a window.

``finish`` is ``Scheduler.finish_requests`` (aborted: freed, cached blocks kept).
``snapshot`` is the pool's rows (:func:`kvhit.engines.vllm.manager.snapshot_row`) and
the store's, as its tier.

What it declares (:data:`OFFLOAD_CAPABILITIES`): what the stateless target declares
(:func:`kvhit.engines.vllm.connector_lookup.connector_capabilities`), but no hash unit (the store
keeps whole blocks) and at most one store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvhit.contract import (
    Admitted,
    Direction,
    EngineConfig,
    EngineFactory,
    Rejected,
    Rule,
    Snapshot,
    Store,
    TierMove,
)
from kvhit.engines.vllm.connector_lookup import CAPABILITIES, build_scheduler, driven, observe
from kvhit.engines.vllm.kv_connector import TieredConnector, loaded_blocks
from kvhit.engines.vllm.manager import new_request, pool_rows, snapshot_row
from kvhit.engines.vllm.options import DivergentHits
from kvhit.engines.vllm.release import MAX_MODEL_LEN, import_failure
from kvhit.errors import TargetError, Unsupported
from kvhit.model.spec import Query, Tier, Upto, local_query

try:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        BlockHash,
        BlockHashListWithBlockSize,
        get_group_id,
        get_request_block_hasher,
        make_block_hash_with_group_id,
    )
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
except ImportError as err:
    raise import_failure(err) from None

from kvhit.engines.vllm.compat import accepted


@dataclass
class SlotStore:
    """The connector's store: ``store``'s slots, each holding the content of one
    block key (a block hash with its group), the keys in the order they were spilled."""

    store: Store
    slots: dict[Any, int] = field(default_factory=dict)
    order: list[Any] = field(default_factory=list)
    protected: frozenset[Any] = frozenset()
    added: list[Any] = field(default_factory=list)

    def spill(self, key: Any) -> int | None:
        """The slot ``key``'s content is spilled to: its own, a free one, or the one
        spilled to longest ago whose key the request being admitted does not use
        (:attr:`protected`: the connector may be restoring it); None if none is."""
        if key in self.slots:
            self.order.remove(key)
        else:
            slot = self.free()
            if slot is None:
                return None
            self.slots[key] = slot
            self.added.append(key)
        self.order.append(key)
        return self.slots[key]

    def free(self) -> int | None:
        """A slot for a new key, its old key dropped; None if every slot is protected."""
        used = set(self.slots.values())
        unused = [s for s in range(self.store.num_blocks) if s not in used]
        if unused:
            return unused[0]
        victim = next((k for k in self.order if k not in self.protected), None)
        if victim is None:
            return None
        self.order.remove(victim)
        return self.slots.pop(victim)

    def admitting(self, keys: frozenset[Any]) -> None:
        """A request whose block keys are ``keys`` is being admitted."""
        self.protected, self.added = keys, []

    def undo(self) -> None:
        """Forget the keys this admit added (their slots are empty again)."""
        for key in self.added:
            self.order.remove(key)
            del self.slots[key]
        self.added = []


def one_store(q: Query) -> str | None:
    """vLLM's scheduler has one KV connector: at most one store."""
    if len(q.tiers) > 1:
        return "vLLM's scheduler has one KV connector here: at most one store"
    return None


OFFLOAD_CAPABILITIES = replace(CAPABILITIES, hash_units=False).with_rules(
    Rule(one_store.__name__, one_store)
)
"""What the stateful ``vllm-connector`` target can be driven with (module docstring)."""


class VllmOffloadEngine:
    """vLLM's scheduler with an offload store as a :class:`~kvhit.contract.StatefulEngine`
    (module docstring)."""

    capabilities = OFFLOAD_CAPABILITIES

    def __init__(self, config: EngineConfig):
        driven()
        self.groups = config.groups
        alignment = config.alignment
        shape = config.as_query(1)
        reason = self.capabilities.refusal(shape)
        if reason is not None:
            raise Unsupported(reason)
        stores = config.stores
        self.store = SlotStore(stores[0]) if stores else None
        self.alignment = alignment
        self.scheduler = build_scheduler(
            local_query(shape), config.num_blocks + 1, DivergentHits.AUTO
        )
        connector = self.scheduler.connector
        assert isinstance(connector, TieredConnector)
        self.connector = connector
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.moves: list[TierMove] = []
        self.hasher = get_request_block_hasher(self.pool.hash_block_size, sha256)
        self.requests: dict[int, Request] = {}
        self.settled = observe(self.scheduler)
        evict = self.pool._maybe_evict_cached_block

        def spilling(block: Any) -> bool:
            primary = [] if block.block_hash is None else [block.block_hash]
            others = self.pool.cached_block_hashes_by_block.get(block.block_id, ())
            for key in [*primary, *others]:
                self.spill(block.block_id, key)
            return bool(evict(block))

        self.pool._maybe_evict_cached_block = spilling
        self.evict = evict

    def spill(self, block: int, key: Any) -> None:
        """Spill pool block ``block``, cached under ``key``, to the store, if the store
        holds its group's kind and has a slot for it."""
        if self.store is None or self.groups[get_group_id(key)].kind not in self.store.store.holds:
            return
        slot = self.store.spill(key)
        if slot is not None:
            self.moves.append(TierMove(Direction.SPILL, block, 0, slot))

    def held(self, group_id: int) -> bool:
        """Whether the store holds group ``group_id``'s kind."""
        return self.store is not None and self.groups[group_id].kind in self.store.store.holds

    def request(self, request_id: str, tokens: Sequence[int]) -> Request:
        """vLLM's request of these tokens, hashed by vLLM's block hasher."""
        return new_request(request_id, tokens, self.hasher)

    def stored_row(self, hashes: list[BlockHash], group_id: int) -> tuple[bool | Upto, ...] | None:
        """The store's row for group ``group_id`` over these hashes (each block whose key
        has a slot), None if the store does not hold the group's kind."""
        if self.store is None or not self.held(group_id):
            return None
        slots = self.store.slots
        b = self.groups[group_id].block_size

        def stored(key: BlockHash) -> bool:
            return make_block_hash_with_group_id(key, group_id) in slots

        return snapshot_row(hashes, b, self.pool.hash_block_size, False, stored)

    def store_query(self, tokens: Sequence[int], hashes: list[BlockHash]) -> Query:
        """What the connector is handed: the store's rows for these tokens as a tier,
        the pool's rows empty (the connector cannot see the pool)."""
        empty = tuple(() for _ in self.groups)
        t = len(tokens)
        q = Query(self.groups, empty, t - 1, t, self.alignment)
        if self.store is None:
            return q
        return Query(self.groups, empty, t - 1, t, self.alignment, None, self.stored(hashes))

    def stored(self, hashes: list[BlockHash]) -> tuple[Tier, ...]:
        """What the store holds of these hashes, as a tier (none without a store)."""
        if self.store is None:
            return ()
        rows = tuple(self.stored_row(hashes, i) for i in range(len(self.groups)))
        return (Tier(self.store.store.name, self.store.store.holds, rows),)

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """The pool's rows for ``tokens`` and, with a store, what it holds of them."""
        hashes = self.request("snapshot", tokens).block_hashes
        return Snapshot(pool_rows(self.pool, self.groups, hashes, False), self.stored(hashes))

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """Schedule the prompt through vLLM's scheduler (module docstring)."""
        if len(tokens) > MAX_MODEL_LEN:
            return Rejected(f"longer than max_model_len ({MAX_MODEL_LEN})")
        req = self.request(str(request), tokens)
        q = self.store_query(tokens, req.block_hashes)
        self.connector.serve(q)
        self.moves = []
        if self.store is not None:
            self.store.admitting(self.request_keys(req))
        self.settled.local = self.settled.blocks = None
        self.written: set[int] = set()
        self.scheduler.add_request(req)
        output = self.step()
        local, took = self.settled.local, self.settled.blocks
        if not output.scheduled_new_reqs or local is None or took is None:
            self.scheduler.finish_requests(str(request), RequestStatus.FINISHED_ABORTED)
            return Rejected("vLLM's scheduler could not schedule the prompt in its pool")
        length = output.scheduled_new_reqs[0].num_computed_tokens
        tables = first = self.tables(req, [[] for _ in self.groups])
        while req.num_computed_tokens < len(tokens):
            done = req.num_computed_tokens
            self.step()
            if req.num_computed_tokens == done:
                return self.stalled(req, tables)
            tables = self.tables(req, tables)
        return self.admitted(request, req, q, (length, local), took, hit_kept(first, tables, took))

    def tables(self, req: Request, seen: list[list[int | None]]) -> list[list[int | None]]:
        """The request's block tables as they stood for its prefill, over the steps so
        far (``seen``: the tables until the last step). vLLM may free a block during a
        split prefill (a passed Mamba state, a block that left a window) and hand it
        out again at another index: the tables now win; an index they leave empty
        keeps its earlier block unless that block now stands elsewhere."""
        null = self.pool.null_block.block_id
        now = [
            [None if b == null else b for b in t]
            for t in self.scheduler.kv_cache_manager.get_block_ids(req.request_id)
        ]
        placed = {b for t in now for b in t if b is not None}
        out = []
        for before, ids in zip(seen, now):
            kept = [
                b if b is not None else (a if a not in placed else None)
                for a, b in zip(before, ids)
            ]
            out.append(kept + ids[len(before) :])
        self.written |= placed
        return out

    def step(self) -> Any:
        """One scheduler step: ``schedule()``, then ``update_from_output`` with a model
        output that samples no token for the scheduled requests (they keep running, as
        a prefill chunk does; the step counts as done, so the blocks freed during it go
        back to the pool)."""
        output = self.scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        index = {"req_id_to_index": {r: i for i, r in enumerate(ids)}}
        ran = ModelRunnerOutput(
            req_ids=ids, sampled_token_ids=[[] for _ in ids], **accepted(ModelRunnerOutput, index)
        )
        self.scheduler.update_from_output(output, ran)
        return output

    def request_keys(self, req: Request) -> frozenset[Any]:
        """The keys of every block of the request, in every group."""
        return frozenset(
            make_block_hash_with_group_id(key, i)
            for i in range(len(self.groups))
            for key in self.view(req, i)
        )

    def stalled(self, req: Request, tables: Any) -> Rejected:
        """A prefill vLLM split (at a Mamba block boundary) and cannot go on with in
        this pool: the request is aborted, every block it was given (:attr:`written`,
        those vLLM freed on the way included) loses its cache entries (evicted, never
        spilled) and the slots this admit added are dropped, so the pool and the store
        hold a part of what they held before; answered ``rejected``."""
        self.tables(req, tables)
        self.scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
        self.step()
        for block_id in self.written:
            self.evict(self.pool.blocks[block_id])
        if self.store is not None:
            self.store.undo()
        return Rejected("vLLM's scheduler split the prefill and cannot go on in this pool")

    def admitted(
        self,
        request: int,
        req: Request,
        q: Query,
        hit: tuple[int, int],
        took: list[list[int]],
        tables: list[list[int | None]],
    ) -> Admitted:
        """The admit's answer for a ``hit`` of (length, local tokens), its moves the
        spills and then the restores; then the blocks that left a window are dropped. A
        block index where vLLM put no block is left out of ``reused`` and the restores
        (the ledger then finds the hit reading nothing there)."""
        length, local = hit
        loads = loaded_blocks(q, local, length)
        restores = self.restores(req, loads, tables)
        reused = tuple(
            tuple(sorted({b for j in [*took[i], *loads[i]] if (b := tables[i][j]) is not None}))
            for i in range(len(self.groups))
        )
        self.scheduler.kv_cache_manager.remove_skipped_blocks(
            req.request_id, len(req.all_token_ids)
        )
        self.requests[request] = req
        rows = tuple(map(tuple, tables))
        return Admitted(length, reused, rows, moves=(*self.moves, *restores))

    def restores(
        self, req: Request, loads: list[list[int]], tables: list[list[int | None]]
    ) -> list[TierMove]:
        """The connector's loads as moves: each loaded block index of each group from
        the slot of its key into the block vLLM put there (none where it put none)."""
        slots = self.store.slots if self.store is not None else {}
        moves = []
        for i, indices in enumerate(loads):
            view = self.view(req, i)
            for j in indices:
                block = tables[i][j]
                if block is not None:
                    slot = slots[make_block_hash_with_group_id(view[j], i)]
                    moves.append(TierMove(Direction.RESTORE, block, 0, slot))
        return moves

    def view(self, req: Request, group_id: int) -> Any:
        """The request's block keys for group ``group_id`` at its block size."""
        b, h = self.groups[group_id].block_size, self.pool.hash_block_size
        return req.block_hashes if b == h else BlockHashListWithBlockSize(req.block_hashes, h, b)

    def finish(self, request: int) -> None:
        """Free the request's blocks (they stay cached until evicted)."""
        req = self.requests.pop(request)
        self.scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
        self.step()  # the step that returns the blocks vLLM deferred freeing


def hit_kept(
    first: list[list[int | None]], tables: list[list[int | None]], took: list[list[int]]
) -> list[list[int | None]]:
    """``tables`` with each block the hit took from the pool at its index as the first
    step had it (the hit read it then; vLLM may have freed it since)."""
    out = [list(t) for t in tables]
    for i, indices in enumerate(took):
        for j in indices:
            out[i][j] = first[i][j]
    return out


def vllm_offload_engine(options: Mapping[str, str]) -> EngineFactory:
    """The stateful ``vllm-connector`` built-in for the target's ``options``: its
    connector answers vLLM's divergent-hits question as the lookup's does by default
    (``auto``), the only setting driven here."""
    if options.get("divergent", "auto") != "auto":
        raise TargetError("--option divergent is for the vllm-connector lookup here")
    driven()
    return VllmOffloadEngine
