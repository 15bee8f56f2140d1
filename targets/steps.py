"""The step protocol: an engine's scheduler loop driven by a program of request events
(docs/design.md §5.7).

The atomic protocol (:mod:`kvhit.targets.stateful`) hands an engine one prompt at a
time and lets it look up, allocate, compute and cache in one call. A *step-level*
engine (:class:`~kvhit.contract.StepEngine`) works as a serving engine's scheduler
does: requests arrive and may be aborted, the engine decides each step, and kvhit, as
the model executor, runs the step and reports it back. A *step program* is the
engine's configuration and a list of events:

==========================================================  ================================
event                                                       meaning
==========================================================  ================================
``{"op": "arrive", "request": r, "prompt": [t, ...],``      a new request: its prompt, and
``"output": [t, ...]}``                                     the tokens the executor samples
                                                            for it, in order (it finishes
                                                            after the last)
``{"op": "abort", "request": r}``                           the client gives up on r
``{"op": "step"}``, with any of ``"cut": [r, ...]``,        the engine schedules a step and
``"fail": [[r, g, j], ...]``                                kvhit runs it: the parts of the
                                                            requests in ``cut`` never run
                                                            (each is aborted in flight; a
                                                            request the step does not run
                                                            is not cut);
                                                            block j of group g of r's table,
                                                            if r loads it in this step, is
                                                            reported as a failed load
==========================================================  ================================

The configuration is the atomic protocol's (groups, ``num_blocks``, alignment, hash
unit) with a token ``budget`` per step and ``asynchronous`` (each step reported one
step late). After the events kvhit runs steps until every request has finished or
been aborted.

    >>> program = StepProgram.from_json({"groups": [{"kind": "full", "block_size": 2}],
    ...     "num_blocks": 8, "budget": 4, "events": [
    ...         {"op": "arrive", "request": 0, "prompt": [1, 2, 3], "output": [4]},
    ...         {"op": "step", "cut": [0]}]})
    >>> program.events[1], program.config.budget
    (StepEvent(cut=(0,), fail=()), 4)

A malformed program is a :class:`~kvhit.model.protocol.QueryError` naming the field:

    >>> StepProgram.from_json({"groups": [{"kind": "full", "block_size": 2}],
    ...     "num_blocks": 8, "events": [{"op": "abort", "request": 3}]})
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: events[0].request: request 3 has not arrived
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvhit.contract import EngineConfig, Scheduled, StepEngine, StepPlan, StepResult
from kvhit.model.protocol import QueryError
from kvhit.targets.stateful import Create, Look, parse_config
from kvhit.targets.wire import BadReturn, shown


@dataclass(frozen=True)
class Arrive:
    """Request ``request`` arrives with ``prompt``; the executor samples ``output``."""

    request: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """The event's protocol form."""
        return {
            "op": "arrive",
            "request": self.request,
            "prompt": list(self.prompt),
            "output": list(self.output),
        }

    def call(self, engine: StepEngine) -> None:
        """Tell the engine."""
        engine.arrive(self.request, self.prompt, len(self.output))

    def decode(self, value: Any) -> None:
        """A program's answer line: anything, ignored."""


@dataclass(frozen=True)
class Abort:
    """The client gives up on ``request``."""

    request: int

    def to_json(self) -> dict[str, Any]:
        """The event's protocol form."""
        return {"op": "abort", "request": self.request}

    def call(self, engine: StepEngine) -> None:
        """Tell the engine."""
        engine.abort(self.request)

    def decode(self, value: Any) -> None:
        """A program's answer line: anything, ignored."""


@dataclass(frozen=True)
class Failure:
    """Block ``index`` of group ``group`` of ``request``'s table fails to load."""

    request: int
    group: int
    index: int


@dataclass(frozen=True)
class StepEvent:
    """One step: the engine schedules, kvhit runs it with these mishaps."""

    cut: tuple[int, ...] = ()
    fail: tuple[Failure, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The event's protocol form."""
        out: dict[str, Any] = {"op": "step"}
        if self.cut:
            out["cut"] = list(self.cut)
        if self.fail:
            out["fail"] = [[f.request, f.group, f.index] for f in self.fail]
        return out


ProgramEvent = Arrive | Abort | StepEvent


@dataclass(frozen=True)
class Schedule:
    """Ask the engine to decide its next step."""

    def to_json(self) -> dict[str, Any]:
        """The message's protocol form."""
        return {"op": "schedule"}

    def call(self, engine: StepEngine) -> Any:
        """Ask the engine."""
        return engine.schedule()

    def decode(self, value: Any) -> StepPlan:
        """A program's answer line (:func:`decode_plan`)."""
        return decode_plan(value)


@dataclass(frozen=True)
class Report:
    """Report the oldest unreported step to the engine."""

    result: StepResult

    def to_json(self) -> dict[str, Any]:
        """The message's protocol form."""
        ran = {str(r.request): list(r.sampled) for r in self.result.ran}
        return {"op": "executed", "ran": ran, "cut": list(self.result.cut),
                "invalid": list(self.result.invalid)}  # fmt: skip

    def call(self, engine: StepEngine) -> Any:
        """Tell the engine; its answer is the requests now finished."""
        return engine.executed(self.result)

    def decode(self, value: Any) -> tuple[int, ...]:
        """A program's answer line: the requests now finished (a list of ids)."""
        return ids(value, "executed")


def ids(value: Any, field: str) -> tuple[int, ...]:
    """A list of request ids; :class:`BadReturn` naming ``field`` otherwise."""
    if not isinstance(value, list) or not all(_count(v, 0) for v in value):
        raise BadReturn(f"{field}: must be a list of request ids, got {shown(value)}")
    return tuple(value)


def decode_plan(value: Any) -> StepPlan:
    """A ``schedule`` answer line as a :class:`~kvhit.contract.StepPlan`:
    ``{"scheduled": [{"request": r, "computed": c, "new": n, "tables": [[id or null,
    ...] per group]}, ...], "preempted": [r, ...]}`` (each scheduled entry may add
    ``hit``, ``drafts`` and ``loaded``; the plan may add ``copies``, ``[[source,
    destination], ...]``, and ``draining``, entries like ``scheduled``'s for aborted
    requests); :class:`BadReturn` if it is not so shaped.

    >>> decode_plan({"scheduled": [{"request": 0, "computed": 0, "new": 2, "tables": [[1]]}]})
    StepPlan(scheduled=(Scheduled(request=0, computed=0, new=2, tables=((1,),), hit=None, drafts=0, loaded=()),), preempted=(), copies=(), draining=())
    """
    if not isinstance(value, dict) or not isinstance(value.get("scheduled"), list):
        raise BadReturn(f"schedule: must be {{'scheduled': [...]}}, got {shown(value)}")
    copies = value.get("copies", [])
    if not isinstance(copies, list) or not all(
        isinstance(c, list) and len(c) == 2 and all(_count(b, 0) for b in c) for c in copies
    ):
        raise BadReturn(
            f"schedule: copies: must be [[source, destination], ...], got {shown(copies)}"
        )
    return StepPlan(
        decode_scheduled(value["scheduled"], "scheduled"),
        ids(value.get("preempted", []), "schedule: preempted"),
        tuple((c[0], c[1]) for c in copies),
        decode_scheduled(value.get("draining", []), "draining"),
    )


def decode_scheduled(value: Any, name: str) -> tuple[Scheduled, ...]:
    """A plan's list of scheduled parts (its field ``name``)."""
    if not isinstance(value, list):
        raise BadReturn(f"schedule: {name}: must be a list, got {shown(value)}")
    out = []
    for k, s in enumerate(value):
        field = f"schedule: {name}[{k}]"
        keys = {"request", "computed", "new", "tables"}
        if (
            not isinstance(s, dict)
            or not keys <= set(s)
            or not all(_count(s[f], 0) for f in keys - {"tables"})
        ):
            raise BadReturn(f"{field}: must have request, computed and new counts and tables")
        tables = s["tables"]
        if not isinstance(tables, list) or not all(isinstance(t, list) for t in tables):
            raise BadReturn(f"{field}.tables: must be a list of block tables")
        if not all(b is None or _count(b, 0) for t in tables for b in t):
            raise BadReturn(f"{field}.tables: a block is a non-negative id or null")
        hit = s.get("hit")
        if hit is not None and not _count(hit, 0):
            raise BadReturn(f"{field}.hit: must be a count, got {shown(hit)}")
        drafts = s.get("drafts", 0)
        if not _count(drafts, 0):
            raise BadReturn(f"{field}.drafts: must be a count, got {shown(drafts)}")
        loaded = s.get("loaded", [])
        if not isinstance(loaded, list):
            raise BadReturn(f"{field}.loaded: must be a list of block lists")
        out.append(Scheduled(s["request"], s["computed"], s["new"], tuple(map(tuple, tables)),
                             hit, drafts, tuple(ids(g, f"{field}.loaded") for g in loaded)))  # fmt: skip
    return tuple(out)


StepMessage = Create | Look | Arrive | Abort | Schedule | Report
"""What kvhit sends a step-level engine."""


@dataclass(frozen=True)
class StepProgram:
    """A step-level engine's configuration and the events to run on it, in order."""

    config: EngineConfig
    events: tuple[ProgramEvent, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The program as JSON (the replay file's ``program``)."""
        return {**self.config.to_json(), "events": [e.to_json() for e in self.events]}

    def with_events(self, events: Sequence[ProgramEvent]) -> StepProgram:
        """The same configuration with other events."""
        return replace(self, events=tuple(events))

    @property
    def requests(self) -> dict[int, Arrive]:
        """Every request's arrival, by id."""
        return {e.request: e for e in self.events if isinstance(e, Arrive)}

    @staticmethod
    def from_json(obj: Any) -> StepProgram:
        """Check a step program and build it; :class:`QueryError` naming the field."""
        config = parse_config(obj)
        budget = obj.get("budget")
        if budget is not None and not _count(budget, 1):
            raise QueryError("budget", f"must be an integer of at least 1, got {budget!r}")
        asynchronous = obj.get("asynchronous", False)
        if not isinstance(asynchronous, bool):
            raise QueryError("asynchronous", "must be true or false")
        config = replace(config, budget=budget, asynchronous=asynchronous)
        events = obj.get("events", [])
        if not isinstance(events, list):
            raise QueryError("events", "must be a list of events")
        return StepProgram(config, parse_events(events, len(config.groups)))


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _tokens(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(_count(t, 0) for t in value):
        raise QueryError(field, "must be a non-empty list of non-negative integers")
    return tuple(value)


def parse_events(events: list[Any], num_groups: int) -> tuple[ProgramEvent, ...]:
    """A program's events, each checked against the ones before it (a request arrives
    once, before anything names it, and is aborted at most once)."""
    arrived: set[int] = set()
    aborted: set[int] = set()
    out: list[ProgramEvent] = []
    for i, obj in enumerate(events):
        event = parse_event(obj, f"events[{i}]", arrived, num_groups)
        if isinstance(event, Arrive):
            arrived.add(event.request)
        elif isinstance(event, Abort):
            if event.request in aborted:
                raise QueryError(
                    f"events[{i}].request", f"request {event.request} was aborted already"
                )
            aborted.add(event.request)
        out.append(event)
    return tuple(out)


def parse_event(obj: Any, field: str, arrived: set[int], num_groups: int) -> ProgramEvent:
    """One event; :class:`QueryError` naming it."""
    if not isinstance(obj, dict) or obj.get("op") not in ("arrive", "abort", "step"):
        raise QueryError(field, "must be {'op': 'arrive' | 'abort' | 'step', ...}")
    if obj["op"] == "step":
        return parse_step(obj, field, arrived, num_groups)
    request: Any = obj.get("request")
    if not _count(request, 0):
        raise QueryError(f"{field}.request", "must be a non-negative integer")
    if obj["op"] == "abort":
        return Abort(_known(request, f"{field}.request", arrived))
    if request in arrived:
        raise QueryError(f"{field}.request", f"request {request} has arrived already")
    return Arrive(request, _tokens(obj.get("prompt"), f"{field}.prompt"),
                  _tokens(obj.get("output"), f"{field}.output"))  # fmt: skip


def _known(request: Any, field: str, arrived: set[int]) -> int:
    if not _count(request, 0) or request not in arrived:
        raise QueryError(field, f"request {request} has not arrived")
    return int(request)


def parse_step(obj: dict[str, Any], field: str, arrived: set[int], num_groups: int) -> StepEvent:
    """A ``step`` event's mishaps."""
    unknown = set(obj) - {"op", "cut", "fail"}
    if unknown:
        raise QueryError(f"{field}.{sorted(unknown)[0]}", "is no field of a step")
    cut = obj.get("cut", [])
    if not isinstance(cut, list):
        raise QueryError(f"{field}.cut", "must be a list of requests")
    cuts = tuple(_known(r, f"{field}.cut[{k}]", arrived) for k, r in enumerate(cut))
    fail = obj.get("fail", [])
    if not isinstance(fail, list):
        raise QueryError(f"{field}.fail", "must be a list of [request, group, block index]")
    fails = tuple(parse_failure(f, f"{field}.fail[{k}]", arrived, num_groups)
                  for k, f in enumerate(fail))  # fmt: skip
    return StepEvent(cuts, fails)


def parse_failure(obj: Any, field: str, arrived: set[int], num_groups: int) -> Failure:
    """One ``[request, group, block index]`` of a step's ``fail``."""
    if not isinstance(obj, list) or len(obj) != 3 or not all(_count(v, 0) for v in obj):
        raise QueryError(field, "must be [request, group, block index] of non-negative integers")
    request, group, index = obj
    _known(request, f"{field}[0]", arrived)
    if group >= num_groups:
        raise QueryError(f"{field}[1]", f"names group {group}; the program has {num_groups}")
    return Failure(request, group, index)
