"""kvhit's own step-level engine: the impl's coordinator inside a small scheduler
(the step contract, :class:`kvhit.contract.StepEngine`).

Requests wait in arrival order. Each step (:meth:`StepImpl.schedule`) runs the running
requests first, one decode token each or the next chunk of a prompt, then admits
waiting ones from their prefix hit while the token budget and the pool allow. A
running request that needs a block the pool does not have preempts the newest running
request: its blocks are freed and it waits again, to restart from a new hit.

Publishing follows the order a ledger holds an engine to: a block's hash is cached
only once the step that writes it has been reported run (:meth:`StepImpl.executed`),
never for a part that was cut, so a Mamba state is never reused in the step that
computes it and a block nobody wrote is never hit. With asynchronous scheduling the
next step is scheduled before the last is reported: it may extend a request whose
part is in flight (its sampled token is a placeholder until then), and it still finds
none of that part's blocks. Blocks that left a window or chunk are dropped once the
step that passed them is reported.

    >>> from kvhit.contract import EngineConfig, Ran, StepResult
    >>> from kvhit.model.spec import Group
    >>> engine = StepImpl(EngineConfig((Group("full", 2),), num_blocks=8, alignment=2, budget=4))
    >>> engine.arrive(0, [1, 2, 3, 4, 5, 6], max_new=1)
    >>> engine.schedule().scheduled
    (Scheduled(request=0, computed=0, new=4, tables=((1, 2),), hit=0, drafts=0, loaded=((),)),)
    >>> engine.snapshot([1, 2, 3, 4, 9]).cached  # scheduled, not yet run: nothing published
    ((False, False),)
    >>> engine.executed(StepResult((Ran(0, ()),)))
    ()
    >>> engine.snapshot([1, 2, 3, 4, 9]).cached
    ((True, True),)
    >>> engine.schedule().scheduled[0].end, engine.executed(StepResult((Ran(0, (7,)),)))
    (6, (0,))
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvhit.contract import (
    Capabilities,
    EngineConfig,
    Scheduled,
    Snapshot,
    StepLoop,
    StepPlan,
    StepResult,
)
from kvhit.errors import Unsupported
from kvhit.impl.coordinator import Coordinator, Request
from kvhit.impl.engine import free_blocks, fresh_blocks
from kvhit.impl.pool import NULL_BLOCK
from kvhit.model.spec import Query, longest_hit

DEFAULT_BUDGET = 8
"""Tokens per step when the configuration names no budget (small, so prompts come in
chunks)."""


@dataclass
class Live:
    """A request the engine has not let go of: its tokens (the prompt, then what it
    sampled), its blocks while it holds some, and how far its steps got."""

    prompt: int
    tokens: list[int]
    max_new: int
    held: Request | None = None
    computed: int = 0
    """Tokens scheduled so far (in flight or run)."""
    written: int = 0
    """Tokens whose steps were reported run: what its blocks hold."""
    in_flight: int = 0
    """Its parts scheduled and not yet reported."""
    sampling: int = 0
    """Of those, the parts that sample a token (a placeholder until reported)."""
    epoch: int = 0
    """Bumped when its parts in flight are void (a cut, a failed load, an abort)."""
    hit: int | None = None
    """The hit to report on its next part (after it arrives or restarts)."""
    loaded: tuple[tuple[int, ...], ...] = ()
    """The hit's blocks, reported as loaded on its next part."""
    leaving: bool = False
    """It lets go of its blocks once no part of it is in flight."""
    gone: bool = False
    """Aborted or finished: forgotten once its blocks are freed."""

    @property
    def outputs(self) -> int:
        """How many tokens it has sampled."""
        return len(self.tokens) - self.prompt

    def todo(self) -> int:
        """How many tokens it could compute now: up to the last known or placeholder
        token, and none once the samples in flight complete its outputs."""
        if self.outputs + self.sampling >= self.max_new:
            return 0
        return len(self.tokens) + self.sampling - self.computed


@dataclass(frozen=True)
class InFlight:
    """One request's part of a step in flight: tokens ``[start, end)``, whether it
    samples a token, and the request's epoch when it was scheduled."""

    request: int
    start: int
    end: int
    samples: bool
    epoch: int


@dataclass
class Draft:
    """A step being decided: the token budget left, the parts so far and the
    requests preempted."""

    budget: int
    scheduled: list[Scheduled] = field(default_factory=list)
    parts: list[InFlight] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)


class StepImpl:
    """The impl's coordinator as a :class:`~kvhit.contract.StepEngine` (see the module
    docstring).

    It declares every kind and window convention, no drafter (a drafter's hit reads
    keys past the tokens a step has, which a request that grows by decoding only gets
    later), no hash unit (its hits and chunks are in whole blocks) and no tiers (its
    pool is its only store). A hit's blocks are what it reports as loaded on the step
    that (re)starts the request: the impl keeps its cache in its pool, so taking a hit
    is its load, and a program may fail one (:meth:`executed`).
    """

    capabilities = Capabilities(
        drafters=frozenset(),
        hash_units=False,
        loop=StepLoop(load_failures=True, boundary_states=True),
    )

    def __init__(self, config: EngineConfig):
        if config.hash_unit is not None or config.stores or any(g.drafter for g in config.groups):
            raise Unsupported("whole blocks, no drafters and no tiers only")
        self.coord = Coordinator(config.groups, config.num_blocks, config.alignment)
        self.budget = config.budget or DEFAULT_BUDGET
        self.lives: dict[int, Live] = {}
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.in_flight: deque[tuple[InFlight, ...]] = deque()
        """The steps scheduled and not yet reported, oldest first."""

    def arrive(self, request: int, prompt: Sequence[int], max_new: int) -> None:
        """Queue a new request (first come, first served)."""
        if request in self.lives or max_new < 1 or not prompt:
            raise ValueError(f"request {request}: a new id, a prompt and max_new >= 1")
        self.lives[request] = Live(len(prompt), list(prompt), max_new)
        self.waiting.append(request)

    def abort(self, request: int) -> None:
        """Forget the request; its parts in flight are void, and its blocks are freed
        once none is in flight."""
        live = self.lives[request]
        live.epoch += 1
        self.leave(request, gone=True)

    def schedule(self) -> StepPlan:
        """Decide the next step: the running requests, then the waiting ones (none
        in a step that preempted)."""
        draft = Draft(self.budget)
        self.run_running(draft)
        if not draft.preempted:
            self.admit_waiting(draft)
        self.in_flight.append(tuple(draft.parts))
        return StepPlan(tuple(draft.scheduled), tuple(draft.preempted))

    def run_running(self, draft: Draft) -> None:
        """Schedule each running request's next tokens, oldest first, preempting the
        newest when the pool is short; stop at the first that cannot run."""
        for request in list(self.running):
            if not draft.budget:
                return
            if request not in self.running:
                continue  # preempted for an older one in this step
            live = self.lives[request]
            new = min(live.todo(), draft.budget)
            if not new:
                continue
            if not self.fit(request, live.computed + new, draft):
                return
            assert live.held is not None, "a running request holds its blocks"
            self.coord.extend(live.held, live.computed + new)
            self.add_part(request, new, draft)

    def fit(self, request: int, end: int, draft: Draft) -> bool:
        """Make room for the request's blocks through token ``end``; False when it
        cannot run in this step."""
        live = self.lives[request]
        assert live.held is not None, "a running request holds its blocks"
        while self.short(live.held, end):
            if not self.make_room(request, draft):
                return False
        return True

    def short(self, held: Request, end: int) -> bool:
        """Whether the pool has fewer free blocks than the request needs through token
        ``end``."""
        need = sum(
            -(-end // g.block_size) - len(table) for g, table in zip(self.coord.groups, held.tables)
        )
        return need > len(self.coord.pool.free_queue)

    def make_room(self, request: int, draft: Draft) -> bool:
        """Preempt the newest running request; whether trying again may help (not
        when that was ``request`` itself, or when its blocks stay held until its part
        in flight is reported)."""
        victim = self.running[-1]
        draft.preempted.append(victim)
        self.leave(victim, gone=False)
        return victim != request and self.lives[victim].held is None

    def admit_waiting(self, draft: Draft) -> None:
        """Start waiting requests from their hits, first come first served, while the
        budget and the pool allow."""
        while draft.budget and self.waiting:
            request = self.waiting[0]
            live = self.lives[request]
            if live.held is not None:
                return  # preempted with a part in flight: its blocks are not free yet
            new = self.start(live, draft.budget)
            if new is None:
                return
            self.waiting.popleft()
            self.running.append(request)
            self.add_part(request, new, draft)

    def start(self, live: Live, budget: int) -> int | None:
        """Look up the request's hit (at most T - 1 tokens) and give it blocks for its
        first chunk; that chunk's length, or None when the pool is too short."""
        held = self.coord.request(list(live.tokens))
        hit = self.coord.find_longest_cache_hit(held, held.num_tokens - 1)
        new = min(held.num_tokens - hit.length, budget)
        if fresh_blocks(self.coord, held, hit, hit.length + new) > free_blocks(
            self.coord.pool, hit
        ):
            self.coord.free(held)
            return None
        self.coord.allocate(held, hit, upto=hit.length + new)
        live.held, live.loaded = held, hit.blocks
        live.computed = live.written = live.hit = hit.length
        return new

    def add_part(self, request: int, new: int, draft: Draft) -> None:
        """Put the request's next ``new`` tokens into the step."""
        live = self.lives[request]
        assert live.held is not None, "a scheduled request holds its blocks"
        end = live.computed + new
        part = InFlight(
            request, live.computed, end, end == len(live.tokens) + live.sampling, live.epoch
        )
        tables = tuple(tuple(None if b == NULL_BLOCK else b for b in t) for t in live.held.tables)
        draft.scheduled.append(
            Scheduled(request, live.computed, new, tables, live.hit, loaded=live.loaded)
        )
        draft.parts.append(part)
        draft.budget -= new
        live.computed, live.hit, live.loaded = end, None, ()
        live.in_flight += 1
        live.sampling += part.samples

    def executed(self, result: StepResult) -> tuple[int, ...]:
        """The oldest step in flight ran: recover from failed loads, then publish each
        part that ran and append what it sampled; a cut part is undone. The requests
        that finished."""
        if not self.in_flight:
            raise ValueError("no step is in flight")
        parts = self.in_flight.popleft()
        self.recover(set(result.invalid))
        sampled = {ran.request: ran.sampled for ran in result.ran}
        finished = []
        for part in parts:
            live = self.lives[part.request]
            live.in_flight -= 1
            live.sampling -= part.samples
            if part.epoch == live.epoch:
                if part.request in result.cut:
                    self.truncate(live, part.start)
                elif self.wrote(part, sampled.get(part.request, ())):
                    finished.append(part.request)
            if live.leaving and not live.in_flight:
                self.release(part.request)
        return tuple(finished)

    def wrote(self, part: InFlight, sampled: Sequence[int]) -> bool:
        """The part ran: publish what it wrote, drop what left a window, take its
        sample; whether the request is now finished."""
        live = self.lives[part.request]
        assert live.held is not None, "a request holds its blocks while a part is in flight"
        live.written = part.end
        self.publish(live.held, part.end)
        if part.samples and sampled:
            live.tokens.extend(sampled)
            live.held = self.coord.grown(live.held, list(live.tokens))
        if live.outputs < live.max_new:
            return False
        self.leave(part.request, gone=True)
        return True

    def publish(self, held: Request, written: int) -> None:
        """Cache the request's blocks its first ``written`` tokens fill, then free those
        no later token reads."""
        self.coord.cache_full_blocks(held, written)
        self.coord.drop_skipped(held, written)

    def recover(self, invalid: set[int]) -> None:
        """Blocks whose load failed hold nothing: uncache them, and fall every request
        holding one back to its recovered hit (:meth:`recovered`), its parts from the
        failing step on void (they read those blocks)."""
        if not invalid:
            return
        for block in invalid:
            self.coord.pool.uncache(block)
        for live in self.lives.values():
            if live.held is not None and holds_any(live.held.tables, invalid):
                length = self.recovered(live, invalid)
                for table in live.held.tables:
                    lost = [j for j, b in enumerate(table) if b in invalid]
                    self.coord.pool.free(table[j] for j in lost)
                    table[:] = [NULL_BLOCK if j in lost else b for j, b in enumerate(table)]
                self.truncate(live, length)

    def recovered(self, live: Live, invalid: set[int]) -> int:
        """The longest prefix still valid for every group: L* over the blocks of its
        written prefix it holds, the invalid ones removed (docs/design.md §1.4). The
        impl loads nothing from outside its pool, so it recomputes from there."""
        assert live.held is not None, "only a request holding blocks recovers"
        rows = tuple(
            tuple(
                b != NULL_BLOCK and b not in invalid for b in table[: live.written // g.block_size]
            )
            for g, table in zip(self.coord.groups, live.held.tables)
        )
        query = Query(self.coord.groups, rows, live.written, len(live.tokens), self.coord.alignment)
        return longest_hit(query).length

    def truncate(self, live: Live, length: int) -> None:
        """Undo the request's progress past ``length`` tokens: its parts in flight are
        void, and it gives back the blocks past the one holding token ``length - 1``
        (new ones are written later)."""
        assert live.held is not None, "only a request holding blocks is truncated"
        live.epoch += 1
        live.computed, live.written = length, min(live.written, length)
        for g, table in zip(self.coord.groups, live.held.tables):
            keep = -(-length // g.block_size)
            self.coord.pool.free(reversed(table[keep:]))
            del table[keep:]

    def leave(self, request: int, gone: bool) -> None:
        """Take the request out of the running (or waiting) requests; a preempted one
        (not ``gone``) waits again, first. Its blocks are freed now, or once no part of
        it is in flight."""
        live = self.lives[request]
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)
        if not gone:
            self.waiting.appendleft(request)
        live.gone = gone
        live.leaving = True
        if not live.in_flight:
            self.release(request)

    def release(self, request: int) -> None:
        """Free the request's blocks (they stay cached until evicted)."""
        live = self.lives[request]
        if live.held is not None:
            self.coord.free(live.held)
            live.held = None
        live.leaving = False
        if live.gone:
            del self.lives[request]

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """Which blocks of ``tokens`` each group finds cached."""
        request = self.coord.request(tokens)
        state = self.coord.state(request)
        self.coord.free(request)
        return Snapshot(state.cached, state.tiers)


def holds_any(tables: Iterable[Sequence[int]], blocks: set[int]) -> bool:
    """Whether some table holds one of ``blocks``."""
    return any(b in blocks for table in tables for b in table)
