"""Built-in targets: implementations the harness can check against the model, in one table.

A built-in has a *lookup* (a callable that takes a normalized protocol query, as
:meth:`kvhit.model.spec.Query.to_json` makes it, and returns
``{"length": L, "blocks": [[j, ...] per group]}``), a *stateful* engine factory
(:mod:`kvhit.targets.stateful`), or both; the shape of states ``kvhit fuzz`` and
``gate`` draw for it; and how to install it when it is missing.

    >>> answer = get("model")({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...                        "cached": [[True, False]], "max_length": 2,
    ...                        "num_tokens": 3, "alignment": 1})
    >>> answer
    {'length': 1, 'blocks': [[0]]}
    >>> load("model", Mode.STATEFUL)
    Traceback (most recent call last):
    ...
    kvhit.errors.TargetError: target 'model' has no stateful engine; stateful built-ins: impl, vllm, sglang, or module:factory

Built-ins are imported only when asked for, so ``vllm`` and ``sglang`` cost nothing unless used.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvhit.errors import TargetError, UndrivableTarget
from kvhit.importing import import_attr
from kvhit.model.protocol import parse_query
from kvhit.reference import fixed_point_answer, min_of_groups_answer

Target = Callable[[dict[str, Any]], Any]


def model_target(query: dict[str, Any]) -> dict[str, Any]:
    """The reference: the fixed point, with the blocks the spec reuses there."""
    return fixed_point_answer(parse_query(query)).to_json()


def seed_min_target(query: dict[str, Any]) -> dict[str, Any]:
    """The rejected PR: the min of the per-group hits (known wrong, only ever unsafe)."""
    return min_of_groups_answer(parse_query(query)).to_json()


class Mode(StrEnum):
    """How a target is driven."""

    LOOKUP = "lookup"
    """A function answering one protocol query (``module:function``)."""
    STATEFUL = "stateful"
    """A factory of engines driven by programs of requests (``module:factory``)."""


@dataclass(frozen=True)
class BuiltIn:
    """A built-in target: its lookup and its stateful factory (``module:attr``, None
    where it has none), the shape of states drawn for it by default
    (:class:`kvhit.harness.random_cases.QueryShape`, the same for both modes), and what to
    say when it cannot be imported."""

    lookup: str | None = None
    stateful: str | None = None
    shape: str = "any"
    hint: str = ""

    def entry(self, mode: Mode) -> str | None:
        """Its ``module:attr`` in ``mode``."""
        return self.lookup if mode == Mode.LOOKUP else self.stateful


VLLM_HINT = (
    "vLLM is not installed here; install it with scripts/install-vllm.sh (see docs/engines/vllm.md)"
)
SGLANG_HINT = "SGLang is not installed here; install it with scripts/install-sglang.sh (see docs/engines/sglang.md)"

BUILTINS: dict[str, BuiltIn] = {
    "model": BuiltIn("kvhit.targets.registry:model_target"),
    "seed-min": BuiltIn("kvhit.targets.registry:seed_min_target"),
    "impl": BuiltIn("kvhit.impl.target:impl_target", "kvhit.impl.stateful_target:StatefulImpl"),
    "vllm": BuiltIn(
        "kvhit.engines.vllm.target:vllm_target",
        "kvhit.engines.vllm.manager:VllmManagerEngine",
        hint=VLLM_HINT,
    ),
    "vllm-undocumented": BuiltIn(
        "kvhit.engines.vllm.divergences:vllm_outside_divergences", hint=VLLM_HINT
    ),
    "sglang": BuiltIn(
        "kvhit.engines.sglang.target:sglang_target",
        "kvhit.engines.sglang.cache:SglangCacheEngine",
        shape="sglang",
        hint=SGLANG_HINT,
    ),
}


def default_shape(name: str | None) -> str:
    """The shape drawn for target ``name`` unless ``--shape`` says otherwise.

    >>> default_shape("sglang"), default_shape("my_engine:lookup")
    ('sglang', 'any')
    """
    builtin = BUILTINS.get(name or "")
    return builtin.shape if builtin is not None else "any"


def entry_of(name: str, mode: Mode) -> str:
    """The ``module:attr`` to import for target ``name`` in ``mode``: a built-in's, or
    ``name`` itself; :class:`TargetError` if there is none."""
    if ":" in name:
        return name
    attr = "function" if mode == Mode.LOOKUP else "factory"
    known = [n for n, b in BUILTINS.items() if b.entry(mode)]
    choices = f"{mode} built-ins: {', '.join(known)}, or module:{attr}"
    if name not in BUILTINS:
        raise TargetError(f"unknown target {name!r}; {choices}")
    entry = BUILTINS[name].entry(mode)
    if entry is None:
        raise TargetError(f"target {name!r} has no {mode} engine; {choices}")
    return entry


def load(name: str, mode: Mode = Mode.LOOKUP) -> Target:
    """Target ``name`` in ``mode``: a built-in, or ``module:attr`` imported with the
    current directory on the path; :class:`TargetError` (ending with the built-in's
    install hint) if it cannot be loaded."""
    entry = entry_of(name, mode)
    if ":" in name and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    builtin = BUILTINS.get(name)
    hint = f"; {builtin.hint}" if builtin is not None and builtin.hint else ""
    module_name, _, attr = entry.partition(":")
    try:
        func = import_attr(entry)
    except UndrivableTarget:
        raise
    except ValueError:
        raise TargetError(f"target {name!r}: expected module:{attr or 'function'}") from None
    except ImportError as err:
        raise TargetError(f"target {name!r}: cannot import {module_name} ({err}){hint}") from None
    except Exception as err:  # the module itself failed while being imported
        reason = f"{type(err).__name__}: {err}"
        raise TargetError(f"target {name!r}: importing it failed ({reason}){hint}") from None
    if not callable(func):
        raise TargetError(f"target {name!r}: {module_name} has no callable {attr!r}")
    return func


def get(name: str) -> Target:
    """The lookup of the built-in target called ``name`` (see :data:`BUILTINS`)."""
    if ":" in name:
        raise TargetError(f"unknown target {name!r}; expected a built-in name")
    return load(name)
