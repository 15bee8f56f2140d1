"""Built-in targets: implementations the harness can check against the model, in one table.

A built-in has a *lookup* (a :class:`kvhit.contract.LookupTarget`: what it can be
asked, its :class:`~kvhit.contract.Capabilities`, and its answer to a query, ``{"length":
L, "blocks": [[j, ...] per group]}``), a *stateful* engine factory
(:data:`kvhit.contract.EngineFactory`), or both; the options it takes
(:class:`~kvhit.contract.Option`: a built-in with options names factories, called with
every option's value); the shape of the rows ``kvhit fuzz`` and ``gate`` draw for it
where its capabilities cannot say it; and how to install it when it is missing.

    >>> from kvhit.model.protocol import parse_query
    >>> get("model").ask(parse_query({"groups": [{"kind": "full", "block_size": 1}],
    ...                               "cached": [[True, False]], "max_length": 2}))
    {'length': 1, 'blocks': [[0]]}
    >>> resolved_options("vllm", {"eagle": "drop"})
    {'eagle': 'drop'}
    >>> resolved_options("model", {"eagle": "drop"})
    Traceback (most recent call last):
    ...
    kvhit.errors.TargetError: target 'model' takes no options
    >>> load("model", Mode.STATEFUL)
    Traceback (most recent call last):
    ...
    kvhit.errors.TargetError: target 'model' has no stateful engine; stateful built-ins: impl, impl-steps, vllm, vllm-connector, vllm-scheduler, sglang, sglang-scheduler, or module:factory

Built-ins are imported only when asked for, so ``vllm`` and ``sglang`` cost nothing unless used.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from typing import Any

from kvhit.analysis import Analysis
from kvhit.contract import Capabilities, LookupTarget, Option, QueryTarget, lookup_target
from kvhit.errors import TargetError, UndrivableTarget, described
from kvhit.importing import import_attr
from kvhit.model.spec import Query


def model_answer(q: Query) -> dict[str, Any]:
    """The reference: the fixed point, with the blocks the spec reuses there."""
    return Analysis(q).fixed_point.to_json()


def seed_min_answer(q: Query) -> dict[str, Any]:
    """The rejected PR: the min of the per-group hits (known wrong, only ever unsafe)."""
    return Analysis(q).min_of_groups.to_json()


model_target = QueryTarget(model_answer, Capabilities(tiers=True))
seed_min_target = QueryTarget(seed_min_answer, Capabilities(tiers=True))


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
    (:class:`kvhit.harness.random_cases.QueryShape`, the same for both modes), what to
    say when it cannot be imported, and what its lookup would otherwise import in its
    first call (``preload``, a ``module:attr`` imported with it, so that loading, not
    the first query, pays for it). With ``options`` (the ``module:attr`` of a tuple of
    :class:`~kvhit.contract.Option`, in a module light enough to import without the
    engine), its entries name factories, each called with every option's value
    (:func:`resolved_options`)."""

    lookup: str | None = None
    stateful: str | None = None
    shape: str = "any"
    hint: str = ""
    preload: str | None = None
    options: str | None = None

    def declared_options(self) -> dict[str, Option]:
        """The options it takes, by name."""
        found = import_attr(self.options) if self.options else ()
        return {option.name: option for option in found}

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
    "impl-steps": BuiltIn(stateful="kvhit.impl.step_engine:StepImpl"),
    "vllm": BuiltIn(
        "kvhit.engines.vllm.target:vllm_lookup",
        "kvhit.engines.vllm.manager:vllm_manager_engine",
        hint=VLLM_HINT,
        options="kvhit.engines.vllm.options:LOOKUP_OPTIONS",
    ),
    "vllm-undocumented": BuiltIn(
        "kvhit.engines.vllm.divergences:vllm_outside_divergences",
        hint=VLLM_HINT,
        preload="kvhit.engines.vllm.target:vllm_lookup",
        options="kvhit.engines.vllm.options:LOOKUP_OPTIONS",
    ),
    "vllm-connector": BuiltIn(
        "kvhit.engines.vllm.connector_lookup:vllm_connector_lookup",
        "kvhit.engines.vllm.connector_engine:vllm_offload_engine",
        hint=VLLM_HINT,
        options="kvhit.engines.vllm.options:CONNECTOR_OPTIONS",
    ),
    "vllm-scheduler": BuiltIn(
        stateful="kvhit.engines.vllm.scheduler_engine:vllm_scheduler_engine",
        hint=VLLM_HINT,
        options="kvhit.engines.vllm.options:SCHEDULER_OPTIONS",
    ),
    "sglang": BuiltIn(
        "kvhit.engines.sglang.target:sglang_target",
        "kvhit.engines.sglang.cache:SglangCacheEngine",
        shape="sglang",
        hint=SGLANG_HINT,
    ),
    "sglang-scheduler": BuiltIn(
        stateful="kvhit.engines.sglang.scheduler_engine:SglangSchedulerEngine",
        shape="sglang",
        hint=SGLANG_HINT,
    ),
    "sglang-hicache": BuiltIn(
        "kvhit.engines.sglang.hicache:sglang_hicache_target",
        shape="sglang-hicache",
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


def resolved_options(name: str, given: Mapping[str, str]) -> dict[str, str]:
    """Every option target ``name`` declares, with the value ``given`` or its default;
    :class:`TargetError` for an option it does not declare or a value it does not take."""
    declared = BUILTINS[name].declared_options() if name in BUILTINS else {}
    for key, value in given.items():
        if not declared:
            raise TargetError(f"target {name!r} takes no options")
        if key not in declared:
            raise TargetError(
                f"target {name!r} has no option {key!r}; its options: {', '.join(declared)}"
            )
        if value not in declared[key].values:
            raise TargetError(
                f"target {name!r}: option {key} takes {', '.join(declared[key].values)}, "
                f"not {value!r}"
            )
    return {key: given.get(key, option.default) for key, option in declared.items()}


def load(name: str, mode: Mode = Mode.LOOKUP, options: Mapping[str, str] | None = None) -> Any:
    """Target ``name`` in ``mode`` with ``options``: a built-in (with what it preloads;
    one that declares options is made by its factory with every option's value), or
    ``module:attr`` imported with the current directory on the path. A lookup comes back
    as a :class:`~kvhit.contract.LookupTarget`, a stateful target as its factory.
    :class:`TargetError` if it cannot be loaded, naming the exception and where it was
    raised, and ending with the built-in's install hint."""
    values = resolved_options(name, options or {})
    entry = entry_of(name, mode)
    if ":" in name and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    builtin = BUILTINS.get(name)
    hint = f"; {builtin.hint}" if builtin is not None and builtin.hint else ""
    if builtin is not None and builtin.preload and mode == Mode.LOOKUP:
        imported(name, builtin.preload, hint)
    func = imported(name, entry, hint)
    if not callable(func):
        module_name, _, attr = entry.partition(":")
        raise TargetError(f"target {name!r}: {module_name} has no callable {attr!r}")
    if values:
        func = func(values)
    return lookup_target(func) if mode == Mode.LOOKUP else func


def imported(name: str, entry: str, hint: str) -> Any:
    """The attribute ``entry`` (``module:attr``) names, for target ``name``;
    :class:`TargetError` saying why it cannot be imported (what the module raised, and
    where; a module written as a file, ``mod.py``, gets the module name to use instead),
    ending with ``hint``."""
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr:
        raise TargetError(f"target {name!r}: expected module:{attr or 'function'}")
    if os.sep in module_name or "/" in module_name:
        raise TargetError(f"target {name!r}: {module_name} is a path{as_module(module_name, attr)}")
    try:
        return import_attr(entry)
    except UndrivableTarget:
        raise
    except ImportError as err:
        reason = f" ({err})" if err.name == module_name else f": {described(err)}"
        why = f"cannot import {module_name}{reason}"
    except Exception as err:  # the module itself failed while being imported
        why = f"importing it failed: {described(err)}"
    raise TargetError(f"target {name!r}: {why}{as_module(module_name, attr)}{hint}")


def as_module(module_name: str, attr: str) -> str:
    """For a module written as a file (``pkg/returns_str.py``), the advice to name the
    module instead; else nothing.

    >>> as_module("./pkg/returns_str.py", "f"), as_module("returns_str", "f")
    ('; name the module, not its file: --target pkg.returns_str:f', '')
    """
    if not module_name.endswith(".py") and os.sep not in module_name and "/" not in module_name:
        return ""
    parts = [p for p in PurePath(module_name.removesuffix(".py")).parts if p not in (".", "/")]
    return f"; name the module, not its file: --target {'.'.join(parts)}:{attr}"


def get(name: str, options: Mapping[str, str] | None = None) -> LookupTarget:
    """The lookup of the built-in target called ``name`` (see :data:`BUILTINS`)."""
    if ":" in name:
        raise TargetError(f"unknown target {name!r}; expected a built-in name")
    return load(name, Mode.LOOKUP, options)
