"""The stateful ``vllm-connector`` target: vLLM's scheduler serving a program, its pool
spilling evicted blocks to an offload store that kvhit's connector restores from.

The engine is vLLM's real ``Scheduler`` with kvhit's connector
(:func:`kvhit.engines.vllm.tiered.build_scheduler`), its pool of ``num_blocks`` blocks
(plus vLLM's null block). The store is the connector's: whenever vLLM's block pool
evicts a cached block (``BlockPool._maybe_evict_cached_block``, observed and called
through), the block's key (its hash with its group, the key the pool held it under)
gets a slot of the store, and the block's content goes there (the engine reports the
spill; the ledger, :mod:`kvhit.harness.ledger`, moves the content). The store holds
every kind (one tier, ``offload``, of whole blocks and Mamba states).

``admit(r, tokens)``: the connector is handed the store's rows for these tokens as a
tiered query (:func:`store_query`: the pool's own rows empty, since the connector
cannot see the pool), vLLM's ``Request`` is added and ``Scheduler.schedule()`` runs
until the prompt is computed (vLLM may split a Mamba prefill at its block boundaries;
the running requests have nothing left to compute, so nothing else is scheduled; a
split prefill that cannot go on in the pool is ``rejected``, :meth:`VllmOffloadEngine.stalled`).
Everything on the way is vLLM's: the local lookup, the connector path of the release
(:class:`kvhit.engines.vllm.tiered.ConnectorPath`), allocation, eviction, caching. The
answer is the hit (local + external tokens), the blocks taken from the pool and from
the store, the tables as they stood for the prefill, the spills made during the admit
and the restores: the blocks the connector loads (:func:`loaded_blocks`) at their
table entries, each from the slot of its key. Then, as the ``vllm`` stateful target
does, ``remove_skipped_blocks`` drops the blocks that left a window.

``finish`` is ``Scheduler.finish_requests`` (aborted: freed, cached blocks kept).
``snapshot`` is the pool's rows (:func:`kvhit.engines.vllm.manager.held_row`) and
the store's, as tier ``offload``.

Refused (``unsupported``): what the stateless target refuses
(:func:`kvhit.engines.vllm.tiered.refused`), and a hash unit (the store keeps whole
blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvhit.engines.vllm.connector import TieredConnector, loaded_blocks
from kvhit.engines.vllm.manager import held_row
from kvhit.engines.vllm.release import MAX_MODEL_LEN, import_failure
from kvhit.engines.vllm.tiered import build_scheduler, observe, refused
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_group
from kvhit.model.spec import KINDS, Query, Tier, default_alignment

try:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        BlockHash,
        BlockHashListWithBlockSize,
        get_request_block_hasher,
        make_block_hash_with_group_id,
    )
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
except ImportError as err:
    raise import_failure(err) from None

from kvhit.engines.vllm.compat import accepted

STORE = "offload"
"""The store's name as a tier."""


class VllmOffloadEngine:
    """vLLM's scheduler with an offload store behind the stateful protocol (module
    docstring)."""

    def __init__(self, config: dict[str, Any]):
        self.groups = tuple(parse_group(g, f"groups[{i}]") for i, g in enumerate(config["groups"]))
        alignment = config.get("alignment") or default_alignment(self.groups)
        if config.get("hash_unit") is not None:
            raise Unsupported("the offload store keeps whole blocks: no hash unit")
        shape = Query(self.groups, tuple(() for _ in self.groups), 0, 1, alignment)
        reason = refused(shape)
        if reason is not None:
            raise Unsupported(reason)
        self.alignment = alignment
        self.scheduler = build_scheduler(shape, config["num_blocks"] + 1)
        connector = self.scheduler.connector
        assert isinstance(connector, TieredConnector)
        self.connector = connector
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.slots: dict[Any, int] = {}
        self.spills: list[list[int]] = []
        self.hasher = get_request_block_hasher(self.pool.hash_block_size, sha256)
        self.requests: dict[int, Request] = {}
        self.settled = observe(self.scheduler)
        evict = self.pool._maybe_evict_cached_block

        def spilling(block: Any) -> bool:
            primary = [] if block.block_hash is None else [block.block_hash]
            others = self.pool.cached_block_hashes_by_block.get(block.block_id, ())
            for key in [*primary, *others]:
                slot = self.slots.setdefault(key, len(self.slots))
                self.spills.append([block.block_id, slot])
            return bool(evict(block))

        self.pool._maybe_evict_cached_block = spilling
        self.evict = evict

    def request(self, request_id: str, tokens: Sequence[int]) -> Request:
        """vLLM's request of these tokens, hashed by vLLM's block hasher."""
        options = {"pooling_params": None, "eos_token_id": None, "block_hasher": self.hasher}
        return Request(
            request_id, list(tokens), SamplingParams(max_tokens=1), **accepted(Request, options)
        )

    def keys(self, hashes: list[BlockHash], group_id: int) -> list[Any]:
        """The store's row for group ``group_id`` over these hashes: each block whose
        key has a slot."""
        b = self.groups[group_id].block_size

        def stored(key: BlockHash) -> bool:
            return make_block_hash_with_group_id(key, group_id) in self.slots

        return held_row(hashes, b, self.pool.hash_block_size, False, stored)

    def store_query(self, tokens: Sequence[int], hashes: list[BlockHash]) -> Query:
        """What the connector is handed: the store's rows for these tokens as tier
        ``offload``, the pool's rows empty."""
        rows = tuple(tuple(self.keys(hashes, i)) for i in range(len(self.groups)))
        tier = Tier(STORE, frozenset(KINDS), rows)
        t = len(tokens)
        empty = tuple(() for _ in self.groups)
        return Query(self.groups, empty, t - 1, t, self.alignment, None, (tier,))

    def snapshot(self, tokens: Sequence[int]) -> dict[str, Any]:
        """The pool's rows for ``tokens`` and the store's (tier ``offload``)."""
        hashes = self.request("snapshot", tokens).block_hashes
        local = [
            held_row(hashes, g.block_size, self.pool.hash_block_size, False, self.pooled(i))
            for i, g in enumerate(self.groups)
        ]
        rows = {str(i): self.keys(hashes, i) for i in range(len(self.groups))}
        tier = {"name": STORE, "holds": [str(k) for k in KINDS], "cached": rows}
        return {"cached": local, "tiers": [tier]}

    def pooled(self, group_id: int) -> Any:
        """Whether the pool holds a key of group ``group_id``."""
        return lambda key: self.pool.get_cached_block(key, [group_id]) is not None

    def admit(self, request: int, tokens: Sequence[int]) -> dict[str, Any]:
        """Schedule the prompt through vLLM's scheduler (module docstring)."""
        if len(tokens) > MAX_MODEL_LEN:
            return {"rejected": f"longer than max_model_len ({MAX_MODEL_LEN})"}
        req = self.request(str(request), tokens)
        q = self.store_query(tokens, req.block_hashes)
        self.connector.serve(q)
        self.spills = []
        self.settled.local = self.settled.blocks = None
        self.written: set[int] = set()
        slots = len(self.slots)
        self.scheduler.add_request(req)
        output = self.step()
        local, took = self.settled.local, self.settled.blocks
        if not output.scheduled_new_reqs or local is None or took is None:
            self.scheduler.finish_requests(str(request), RequestStatus.FINISHED_ABORTED)
            return {"rejected": "vLLM's scheduler could not schedule the prompt in its pool"}
        length = output.scheduled_new_reqs[0].num_computed_tokens
        tables = first = self.tables(req, [[] for _ in self.groups])
        while req.num_computed_tokens < len(tokens):
            done = req.num_computed_tokens
            self.step()
            if req.num_computed_tokens == done:
                return self.stalled(req, tables, slots)
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

    def stalled(self, req: Request, tables: Any, slots: int) -> dict[str, Any]:
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
        for key in [k for k, slot in self.slots.items() if slot >= slots]:
            del self.slots[key]
        return {"rejected": "vLLM's scheduler split the prefill and cannot go on in this pool"}

    def admitted(
        self,
        request: int,
        req: Request,
        q: Query,
        hit: tuple[int, int],
        took: list[list[int]],
        tables: list[list[int | None]],
    ) -> dict[str, Any]:
        """The admit's answer for a ``hit`` of (length, local tokens); then the blocks
        that left a window are dropped. A block index where vLLM put no block is left
        out of ``reused`` and ``restored`` (the ledger then finds the hit reading
        nothing there)."""
        length, local = hit
        loads = loaded_blocks(q, local, length)
        restored = [
            [tables[i][j], self.slots[make_block_hash_with_group_id(self.view(req, i)[j], i)]]
            for i in range(len(self.groups))
            for j in loads[i]
            if tables[i][j] is not None
        ]
        reused = [
            sorted({b for j in [*took[i], *loads[i]] if (b := tables[i][j]) is not None})
            for i in range(len(self.groups))
        ]
        self.scheduler.kv_cache_manager.remove_skipped_blocks(
            req.request_id, len(req.all_token_ids)
        )
        self.requests[request] = req
        return {
            "length": length,
            "reused": reused,
            "tables": tables,
            "spilled": self.spills,
            "restored": restored,
        }

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
