"""Every theorem can fail: a deliberate break of the code it is about refutes it.

For a claim expected to hold, the break (a finder, the loop, the formula) must turn
it into ``refuted``. For a known-wrong algorithm, expected refuted, the repair (the
right algorithm in its place) must turn it into ``proved``: so each refutation is
about that algorithm. Bounds are small, so each run takes a second or two. Theorem
names are checked against the registry, so a new theorem without a mutation here
fails :func:`test_every_theorem_has_a_mutation`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import z3
from test_proofs_tiers import tier_rows_lent

from kvhit.impl import coordinator, formula
from kvhit.model import algorithms, finders, recovery, spec
from kvhit.model.algorithms import Loop
from kvhit.model.finders import Scan
from kvhit.model.ops import PY
from kvhit.model.spec import Drafter, Kind, Upto
from kvhit.proofs import common
from kvhit.proofs import linearize as linear
from kvhit.proofs.registry import Status, all_theorems, get
from kvhit.proofs.runner import run_theorem
from kvhit.proofs.theorems import contracts, eagle, min_groups, rounding

Patch = Callable[[pytest.MonkeyPatch], None]


def settle_always(self: Loop, state: Any, after: Any) -> Any:
    """Settles after the first pass, whatever it did."""
    return self.ops.ite(state[1], state[0], after), True


def settle_never(self: Loop, state: Any, after: Any) -> Any:
    """Never settles: a pass that changed nothing is not noticed."""
    return self.ops.ite(state[1], state[0], after), state[1]


def turn_stopping_after_one_pass(self: Loop, state: Any) -> Any:
    """The driver stops after its first pass, whatever the pass did."""
    return self.step(state), True


def visit_skipping_group_0(self: Loop, length: Any, g: Any) -> Any:
    """A pass that leaves out group 0."""
    return self.ops.ite(g == 0, length, self.finder(g, length))


def visit_one_lower(self: Loop, length: Any, g: Any) -> Any:
    """The last group's finder answers one token less than it should (down to 0)."""
    hit = self.finder(g, length)
    return self.ops.ite(g == self.groups - 1, self.ops.max(0, hit - 1), hit)


def full_scan_past_misses(g: Any, fr: Any, ops: Any) -> Scan:
    """A full-attention scan that does not stop at the first miss."""
    original = SCANS["full"](g, fr, ops)
    return Scan(
        original.direction,
        original.limit,
        original.start,
        lambda s, j, cached: (ops.ite(cached, j + 1, s[0]), s[1]),
        original.finish,
    )


SCANS = dict(finders.SCANS)


def tight_floor(x: Any, dq: Any, d: Any) -> Any:
    """A wrong floor bound: x is claimed less than one past d·(x / d)."""
    return z3.And(dq <= x, x < dq + 1)


def floor_window(g: Any, ops: Any = PY) -> Any:
    return ops.div(g.window - 1, g.block_size)


def inclusive_window(g: Any, ops: Any = PY) -> Any:
    """A finder's window span read as inclusive whatever its group's convention."""
    return SPAN(replace(g, window_convention="inclusive"), ops)


SPAN = spec.window_span


def full_reusing_last_block(g: Any, length: Any, ops: Any = PY) -> tuple[Any, Any]:
    """Full attention needing only its last block (as if it were mamba)."""
    lo, hi = REUSED(g, length, ops)
    return (hi - 1, hi) if g.kind == "full" else (lo, hi)


REUSED = spec.reused_range


def top_one_lower(q: Any, ops: Any = PY) -> Any:
    return ops.max(0, (ops.div(q.max_length, q.alignment) - 1) * q.alignment)


def stack_without_offsets(plans: Any, sizes: Any) -> Any:
    """Every group's ranges read from the start of the row, not from its own stretch."""
    return STACK(plans, [0] * len(sizes))


STACK = formula.stack


def loose_cover(misses_at: Any, lo: Any, hi: Any) -> Any:
    """Blocks [lo, hi) count as cached with at most one miss among them."""
    return misses_at(hi) <= misses_at(lo) + 1


FRAME = finders.frame_for


def frame_without_lookahead(g: Any, m: Any, alignment: Any, num_tokens: Any, ops: Any = PY) -> Any:
    """A finder frame that does not clamp the top to T - La for a lookahead drafter."""
    plain = replace(g, drafter=None) if g.drafter == Drafter.LOOKAHEAD else g
    return FRAME(plain, m, alignment, num_tokens, ops)


FINE_ROW = spec.fine_row


def fine_row_mamba_all_units(g: Any, row: Any, unit: int) -> tuple[bool, ...]:
    """A Mamba block that holds a state sets every unit of its block, as if it held the
    state at each fine boundary (attention rows as before)."""
    if g.kind != Kind.MAMBA:
        return FINE_ROW(g, row, unit)
    per = g.block_size // unit
    return tuple(
        bit for entry in row for bit in [isinstance(entry, Upto) or PY.bit([entry], 0)] * per
    )


def named_or_after(indices: Any, j: Any, ops: Any = PY) -> Any:
    """Block j pruned when it is invalid or comes after an invalid block of its group
    (vLLM's eviction of the "downstream dependent blocks"), so no hit skips a hole."""
    return ops.or_(*(ops.and_(i >= 0, i <= j) for i in indices))


def none_drafter_drops(self: Any) -> bool:
    """A group whose drafter drops nothing (none) treated as an eagle group."""
    return self.drafter in (Drafter.DROP, Drafter.NONE)


def patch_fine_row(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(spec, "fine_row", fine_row_mamba_all_units)
    mp.setattr(common, "fine_row", fine_row_mamba_all_units)


BREAKS: dict[str, tuple[int | None, Patch]] = {
    "fixed_point_maximal": (None, lambda mp: mp.setattr(Loop, "settle", settle_always)),
    "fixed_point_model_code": (
        3,
        lambda mp: mp.setattr(Loop, "visit", visit_skipping_group_0),
    ),
    "termination": (None, lambda mp: mp.setattr(Loop, "settle", settle_never)),
    "fixed_point_driver": (None, lambda mp: mp.setattr(Loop, "turn", turn_stopping_after_one_pass)),
    "many_passes": (4, lambda mp: mp.setattr(Loop, "visit", visit_one_lower)),
    "finder_contracts": (
        None,
        lambda mp: (
            mp.setattr(finders, "window_span", lambda g, ops: floor_window(g, ops)),
            mp.setattr(contracts, "CONFIGS", ((2, 2),)),
        ),
    ),
    "finder_contracts_symbolic": (
        None,
        lambda mp: mp.setattr(finders, "window_span", lambda g, ops: floor_window(g, ops)),
    ),
    "arithmetic_lemmas": (None, lambda mp: mp.setattr(linear, "floor_bounds", tight_floor)),
    "finder_contracts_bounded": (
        4,
        lambda mp: mp.setattr(finders, "window_span", lambda g, ops: floor_window(g, ops)),
    ),
    "finder_contracts_bounded_unit_blocks": (
        4,
        lambda mp: mp.setitem(finders.SCANS, "full", full_scan_past_misses),
    ),
    "full_downward_closed": (
        4,
        lambda mp: mp.setattr(spec, "reused_range", full_reusing_last_block),
    ),
    "full_evaluate_once": (3, lambda mp: mp.setitem(finders.SCANS, "full", full_scan_past_misses)),
    "one_pass_shortcut": (2, lambda mp: mp.setitem(finders.SCANS, "full", full_scan_past_misses)),
    "min_at_least_longest": (3, lambda mp: mp.setattr(algorithms, "top_length", top_one_lower)),
    "own_block_rounding": (
        3,
        lambda mp: mp.setattr(rounding, "own_block_passes", lambda q, ops: 1),
    ),
    "eagle_single_drop": (
        2,
        lambda mp: mp.setattr(eagle, "fixed_point", algorithms.spiral_fixed_point),
    ),
    "impl_formula": (3, lambda mp: mp.setattr(formula, "covered", loose_cover)),
    "impl_lookup": (4, lambda mp: mp.setattr(coordinator, "stack", stack_without_offsets)),
    "impl_lookup_fine": (3, lambda mp: mp.setattr(coordinator, "stack", stack_without_offsets)),
    "drafter_none_same": (
        None,
        lambda mp: mp.setattr(spec.Group, "eagle", property(none_drafter_drops)),
    ),
    "fine_row_faithful": (2, patch_fine_row),
    "tiered_fixed_point_longest": (2, lambda mp: mp.setattr(spec, "tier_rows", tier_rows_lent)),
    "recovered_is_longest": (2, lambda mp: mp.setattr(recovery, "named", named_or_after)),
}
"""Claims expected to hold: (bound, the break)."""

MORE_BREAKS: list[tuple[str, int | None, Patch]] = [
    # termination proves the pass contract it rests on, so a broken pass refutes it too
    ("termination", None, lambda mp: mp.setattr(Loop, "visit", visit_skipping_group_0)),
    ("fixed_point_maximal", None, lambda mp: mp.setattr(Loop, "visit", visit_one_lower)),
]
"""Further breaks of theorems that rest on more than one piece of code."""

REPAIRS: dict[str, tuple[int, Patch]] = {
    "min_is_longest": (
        3,
        lambda mp: mp.setattr(min_groups, "min_of_groups", algorithms.fixed_point),
    ),
    "eagle_spiral": (3, lambda mp: mp.setattr(eagle, "spiral_fixed_point", algorithms.fixed_point)),
    "single_pass_two_windows": (
        3,
        lambda mp: mp.setattr(eagle, "single_pass", algorithms.fixed_point),
    ),
    "own_block_rounding_coarse_alignment": (
        3,
        lambda mp: mp.setattr(rounding, "own_block_fixed_point", algorithms.fixed_point),
    ),
    "min_is_longest_hash_unit": (
        2,
        lambda mp: mp.setattr(min_groups, "min_of_groups", algorithms.fixed_point),
    ),
    "mamba_eagle_margin": (2, lambda mp: mp.setattr(eagle, "margin_groups", lambda q: q)),
    "mamba_eagle_margin_unsafe": (2, lambda mp: mp.setattr(eagle, "margin_groups", lambda q: q)),
    "window_downward_closed": (
        3,
        lambda mp: mp.setattr(spec, "window_span", lambda g, ops=PY: g.window + 10**6),
    ),
    **{
        f"{run.__name__}_safe": (
            3,
            lambda mp, name=name: mp.setitem(
                algorithms.WRONG_TIER_COMBINATIONS, name, algorithms.fixed_point
            ),
        )
        for name, run in algorithms.WRONG_TIER_COMBINATIONS.items()
    },
    **{
        f"{run.__name__}_recovers": (
            3,
            lambda mp, name=name: mp.setitem(
                recovery.WRONG_RECOVERY_RULES, name, recovery.recovered_length
            ),
        )
        for name, run in recovery.WRONG_RECOVERY_RULES.items()
    },
}
"""Known-wrong algorithms: (bound, the repair)."""


DEFAULT_CATCHES: dict[str, tuple[str, Patch]] = {
    "finder_contracts_bounded": (
        "finder_contracts",
        lambda mp: mp.setattr(contracts, "CONFIGS", ((2, 4),)),
    ),
    "finder_contracts_bounded_unit_blocks": ("full_evaluate_once", lambda mp: None),
}
"""A deep theorem (run only under --deep): the theorem of the default suite that
refutes its break too, and how to keep that run small (fewer of the same goals)."""


@pytest.fixture(autouse=True)
def fresh_lookup_plans() -> Iterator[None]:
    """A break of the impl must not outlive its test in the coordinator's plan cache."""
    yield
    coordinator.lookup_plan.cache_clear()


def test_every_theorem_has_a_mutation() -> None:
    names = {t.name for t in all_theorems()}
    assert names == set(BREAKS) | set(REPAIRS)


@pytest.mark.parametrize(
    ("name", "bound", "patch"),
    [(name, *BREAKS[name]) for name in sorted(BREAKS)] + MORE_BREAKS,
    ids=[*sorted(BREAKS), *(f"{name}-more" for name, _, _ in MORE_BREAKS)],
)
def test_a_break_refutes_the_theorem(
    name: str, bound: int | None, patch: Patch, monkeypatch: pytest.MonkeyPatch
) -> None:
    theorem = get(name)
    assert theorem.expected == Status.PROVED
    assert run_theorem(theorem, bound=bound, timeout=30).status == Status.PROVED
    patch(monkeypatch)
    result = run_theorem(theorem, bound=bound, timeout=30)
    assert result.status == Status.REFUTED, result.detail
    if result.counterexample is not None:
        assert result.counterexample.broken


@pytest.mark.parametrize("deep", sorted(DEFAULT_CATCHES))
def test_the_default_suite_refutes_each_deep_theorems_break(
    deep: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moving a cross-check to --deep loses nothing: its break is refuted by a
    theorem of the default suite; and every deep theorem is listed here."""
    assert {t.name for t in all_theorems() if t.deep} == set(DEFAULT_CATCHES)
    catcher, smaller = DEFAULT_CATCHES[deep]
    assert get(deep).deep and not get(catcher).deep
    smaller(monkeypatch)
    BREAKS[deep][1](monkeypatch)
    result = run_theorem(get(catcher), bound=4, timeout=30)
    assert result.status == Status.REFUTED, result.detail


def test_only_the_driver_theorem_refutes_a_driver_stopping_after_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unbounded loop theorems are about the loop's step, not the driver that
    runs it: the driver's own theorem (default suite, unbounded) is what refutes a
    driver that stops after its first pass."""
    monkeypatch.setattr(Loop, "turn", turn_stopping_after_one_pass)
    assert not get("fixed_point_driver").deep and not get("fixed_point_driver").bounded
    assert run_theorem(get("fixed_point_driver")).status == Status.REFUTED
    for name in ("fixed_point_maximal", "termination"):
        assert run_theorem(get(name)).status == Status.PROVED


@pytest.mark.parametrize("name", sorted(REPAIRS))
def test_a_repair_proves_the_known_wrong_claim(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    theorem = get(name)
    assert theorem.expected == Status.REFUTED
    bound, patch = REPAIRS[name]
    assert run_theorem(theorem, bound=bound, timeout=30).status == Status.REFUTED
    patch(monkeypatch)
    result = run_theorem(theorem, bound=bound, timeout=30)
    assert result.status == Status.PROVED, result.detail


@pytest.mark.parametrize(
    ("name", "bound"),
    [
        ("finder_contracts", None),
        ("finder_contracts_symbolic", None),
        ("finder_contracts_bounded", 4),
        ("finder_contracts_bounded_unit_blocks", 4),
    ],
)
def test_a_finder_ignoring_the_exclusive_window_is_refuted(
    name: str, bound: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the finder reads every window as inclusive; the spec's ``valid`` still
    reads the convention. The first goal to fail is an exclusive one (the inclusive
    sliding window goals before it are proved), and an unrolled counterexample
    replays under the exclusive convention."""
    monkeypatch.setattr(finders, "window_span", inclusive_window)
    monkeypatch.setattr(contracts, "CONFIGS", ((2, 2),))
    result = run_theorem(get(name), bound=bound, timeout=30)
    assert result.status == Status.REFUTED, result.detail
    *proved, failed = result.goals
    assert failed.name.startswith("sliding_window exclusive"), failed.name
    assert {g.status for g in proved} == {"unsat"}
    assert any(g.name.startswith("sliding_window b") for g in proved)
    if get(name).bounded:
        cx = result.counterexample
        assert cx is not None and cx.broken and cx.query.groups[0].exclusive


def test_a_goal_whose_assumptions_are_unsat_is_vacuous() -> None:
    import z3

    from kvhit.proofs.registry import Goal, Theorem

    x = z3.Int("x")
    t = Theorem(
        "vacuous",
        "x > 0 and x < 0 imply anything",
        Status.PROVED,
        False,
        lambda b: [Goal("contradiction", [x > 0, x < 0], x != 7)],
    )
    result = run_theorem(t)
    assert result.status == Status.VACUOUS and not result.ok
    assert "assumptions alone are unsat" in result.detail


@pytest.mark.parametrize("name", ["finder_contracts", "finder_contracts_symbolic"])
def test_a_lookahead_finder_looking_past_its_keys_is_refuted(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookahead finder whose frame does not clamp the top to T - La (where its keys
    stop) breaks its contract; the theorems run over the lookahead finders only."""
    lookahead = tuple(f for f in contracts.CONTRACT_FINDERS if f.drafter == Drafter.LOOKAHEAD)
    monkeypatch.setattr(contracts, "CONTRACT_FINDERS", lookahead)
    monkeypatch.setattr(contracts, "LOOKAHEAD_CONFIGS", ((2, 4),))
    assert run_theorem(get(name), timeout=30).status == Status.PROVED
    monkeypatch.setattr(finders, "frame_for", frame_without_lookahead)
    result = run_theorem(get(name), timeout=30)
    assert result.status == Status.REFUTED, result.detail
    assert "lookahead" in result.goals[-1].name
