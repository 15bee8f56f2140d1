"""One analysis of a query, each part worked out once, when first asked, and the one
ordered enum of verdicts (docs/design.md §5.3).

An :class:`Analysis` holds a query and everything kvhit says about it: its normal
forms (the fine query, tiers folded in; the reduced one), L* and its blocks, the fixed
point's answer, each group's finder result, the min of groups, the known-wrong tier
combinations, the blocks at a length, the misses at a length, the verdict on a length.
``kvhit check``, the judge, the report, the drawing and the shrinker are all handed one,
so no part is worked out twice for one query. Each runs the model's own functions
(:mod:`kvhit.model.spec`, :mod:`kvhit.model.algorithms`) on the
:func:`~kvhit.model.spec.reduced` query and shifts the length back, which is exact (see
there): a query with M = 10^12 and one cached block costs what a query with M = 1 costs.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1},
    ...                             {"kind": "sliding_window", "block_size": 1, "window": 1}],
    ...                  "cached": ["1", ""], "max_length": 10**12})
    >>> a = Analysis(q)
    >>> a.longest_hit, a.finder_results, a.verdict(2)
    (Answer(length=1, blocks=((0,), ())), (1, 1000000000000), <Verdict.UNSAFE: 'unsafe'>)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property

from kvhit.model.algorithms import fixed_point, only_groups, per_group
from kvhit.model.spec import (
    Answer,
    Kind,
    Miss,
    Query,
    answer_at,
    coarse_answer,
    fine_query,
    local_query,
    longest_hit,
    misses,
    reduced,
    top_length,
)
from kvhit.model.tiers import HitPlan, hit_plan


class Verdict(StrEnum):
    """The class of a reply to a query (docs/design.md §5.3), the one vocabulary of
    verdicts: the judge's, the drawing's, the documented divergences', the reports'.
    A member equals its value as a string (the value is what saved files and JSON hold).

    Members are declared in the order reports show them: ``ok``, then the disagreements
    worst first (their :attr:`severity`), then the replies that are no disagreement.

        >>> [v.value for v in DISAGREEMENTS][:3], Verdict.LOST_REUSE.label
        (['unsafe', 'lost_reuse', 'wrong_blocks'], 'lost reuse')
        >>> Verdict.UNSAFE.severity > Verdict.CRASH.severity > Verdict.OK.severity
        True
    """

    OK = "ok"
    UNSAFE = "unsafe"
    LOST_REUSE = "lost_reuse"
    WRONG_BLOCKS = "wrong_blocks"
    STUCK = "stuck"
    CRASH = "crash"
    TIMEOUT = "timeout"
    BAD_RETURN = "bad_return"
    UNSUPPORTED = "unsupported"
    REJECTED = "rejected"

    @property
    def disagrees(self) -> bool:
        """Whether a reply of this class disagrees with the spec: ``unsupported`` (the
        target refused the configuration) and ``rejected`` (a stateful engine's pool
        cannot hold the request now) are counted, never disagreements."""
        return self not in (Verdict.OK, Verdict.UNSUPPORTED, Verdict.REJECTED)

    @property
    def severity(self) -> int:
        """How bad a reply of this class is: 0 for no disagreement, and among the
        disagreements the earlier declared the higher (``unsafe`` is the worst)."""
        if not self.disagrees:
            return 0
        return len(DISAGREEMENTS) - DISAGREEMENTS.index(self)

    @property
    def label(self) -> str:
        """The verdict as a drawing writes it: ``lost reuse``; ``correct`` for ok."""
        return "correct" if self == Verdict.OK else self.value.replace("_", " ")


DISAGREEMENTS = tuple(v for v in Verdict if v.disagrees)
"""The disagreement classes, worst first."""


@dataclass(frozen=True)
class Analysis:
    """Everything kvhit works out about ``query``; each property is computed the first
    time it is asked for and kept. Lengths and blocks are in the query's own terms
    (its tokens, its blocks), whatever normal form they were worked out on."""

    query: Query

    @classmethod
    def knowing(cls, query: Query, longest_hit: Answer | None) -> Analysis:
        """The analysis of ``query`` when a case source already knows L*'s answer (the
        exhaustive scopes compute it for a whole scope at once); None: not known.

            >>> from kvhit.model.protocol import parse_query
            >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}],
            ...                  "cached": ["1"], "max_length": 1})
            >>> Analysis.knowing(q, Answer(1, ((0,),))).verdict(1)
            <Verdict.OK: 'ok'>
        """
        out = cls(query)
        if longest_hit is not None:
            vars(out)["longest_hit"] = longest_hit  # a cached_property's own slot
        return out

    @cached_property
    def fine_query(self) -> Query:
        """The query at hash-unit granularity with every tier folded into its rows
        (:func:`kvhit.model.spec.fine_query`): bit rows, every rule applies unchanged."""
        return fine_query(self.query)

    @cached_property
    def reduced(self) -> tuple[Query, int]:
        """The fine query with M within its rows, and the shift s back to the query's
        own lengths (:func:`kvhit.model.spec.reduced`)."""
        return reduced(self.fine_query)

    @cached_property
    def longest_hit(self) -> Answer:
        """L* and the blocks each group reuses there: the spec itself, every candidate of
        the reduced query tried from the top (:func:`kvhit.model.spec.longest_hit`)."""
        small, shift = self.reduced
        return self.shifted(longest_hit(small), shift)

    @cached_property
    def fixed_point(self) -> Answer:
        """The fixed point's answer (:func:`kvhit.model.algorithms.fixed_point`, the
        correct algorithm) and the blocks reused there; equal to :attr:`longest_hit`."""
        small, shift = self.reduced
        return self.shifted(answer_at(small, fixed_point(small)), shift)

    @cached_property
    def finder_results(self) -> tuple[int, ...]:
        """Each group's own finder result from the longest candidate
        (:func:`kvhit.model.algorithms.per_group`), each run on its own group's reduced
        query: a group's finder reads only its own row."""
        fine = self.fine_query
        out = []
        for g, row in zip(fine.groups, fine.cached):
            alone, shift = reduced(replace(fine, groups=(g,), cached=(row,)))
            out.append(per_group(alone)[0] + shift)
        return tuple(out)

    @cached_property
    def min_of_groups(self) -> Answer:
        """The rejected algorithm's answer: the min of :attr:`finder_results`."""
        return self.answer_at(min(self.finder_results))

    @cached_property
    def wrong_tier_answers(self) -> dict[str, int]:
        """What each known-wrong tier combination
        (:data:`~kvhit.model.algorithms.WRONG_TIER_COMBINATIONS`) answers, composed of
        :attr:`finder_results` and fixed points as the model composes it of the finders
        and the fixed point, so in time in the rows.

            >>> from kvhit.model.protocol import parse_query
            >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1},
            ...                             {"kind": "mamba", "block_size": 1}],
            ...                  "cached": ["1", "0" * 9 + "1"], "max_length": 10**12})
            >>> Analysis(q).wrong_tier_answers["max of groups"]
            10
        """
        q, hits = self.query, self.finder_results
        kinds = [g.kind for g in q.groups]
        full = [h for h, k in zip(hits, kinds) if k == Kind.FULL]
        dense = [h for h, k in zip(hits, kinds) if k != Kind.MAMBA]
        attention = [i for i, k in enumerate(kinds) if k != Kind.MAMBA]
        best = self.fixed_point.length
        extended = best
        if attention:
            local = Analysis(local_query(q)).fixed_point.length
            extended = max(local, Analysis(only_groups(q, attention)).fixed_point.length)
        return {
            "max of groups": max(hits),
            "full attention alone": full[0] if full else best,
            "dense min, Mamba trimmed": min(dense, default=top_length(q)),
            "local then external": extended,
        }

    @cached_property
    def hit_plan(self) -> HitPlan:
        """What the engine does at L*: where each reused block is loaded from, and the
        tokens it computes (:func:`kvhit.model.tiers.hit_plan`)."""
        return hit_plan(self.query, self.longest_hit.length)

    def answer_at(self, length: int) -> Answer:
        """The answer a correct engine gives when it settles on ``length``
        (:func:`kvhit.model.spec.answer_at`)."""
        return coarse_answer(self.query, answer_at(self.fine_query, length))

    def misses(self, length: int) -> list[Miss]:
        """For each group that cannot serve ``length``, why not; empty when it is valid
        (:func:`kvhit.model.spec.misses`; with a hash unit, runs of units)."""
        return misses(self.fine_query, length)

    def verdict(self, length: int) -> Verdict:
        """A hit of ``length`` against L*: ``unsafe`` (longer), ``lost_reuse``
        (shorter) or ``ok``."""
        best = self.longest_hit.length
        if length > best:
            return Verdict.UNSAFE
        return Verdict.LOST_REUSE if length < best else Verdict.OK

    def shifted(self, small: Answer, shift: int) -> Answer:
        """An answer of the reduced query as an answer of the query: ``shift`` tokens
        longer, in the query's own blocks."""
        return coarse_answer(self.query, Answer(small.length + shift, small.blocks))
