"""Built-in targets: implementations the harness can check against the model.

A target is a callable that takes a *normalized* protocol query (a dict, as
:meth:`kvhit.model.spec.Query.to_json` makes it) and returns
``{"length": L, "blocks": [[j, ...] per group]}``.

    >>> answer = get("model")({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...                        "cached": [[True, False]], "max_length": 2,
    ...                        "num_tokens": 3, "alignment": 1})
    >>> answer
    {'length': 1, 'blocks': [[0]]}

Built-ins are imported only when asked for, so ``vllm`` and ``sglang`` cost nothing unless used.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
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


BUILTINS: dict[str, str] = {
    "model": "kvhit.targets.registry:model_target",
    "seed-min": "kvhit.targets.registry:seed_min_target",
    "impl": "kvhit.impl.target:impl_target",
    "vllm": "kvhit.engines.vllm.target:vllm_target",
    "vllm-undocumented": "kvhit.engines.vllm.divergences:vllm_outside_divergences",
    "sglang": "kvhit.engines.sglang.target:sglang_target",
}

SHAPES: dict[str, str] = {"sglang": "sglang"}
"""The shape ``kvhit fuzz`` and ``gate`` draw for a built-in target by default (``any``
for the others): only states that target can hold
(:class:`kvhit.harness.random_cases.QueryShape`), for the stateless target and for the
stateful engine of that name alike."""

VLLM_HINT = "vLLM is not installed here; install it with scripts/install-vllm.sh (see the README)"
SGLANG_HINT = (
    "SGLang is not installed here; install it with scripts/install-sglang.sh (see the README)"
)
INSTALL_HINTS = {"vllm": VLLM_HINT, "vllm-undocumented": VLLM_HINT, "sglang": SGLANG_HINT}


def load_callable(spec: str) -> Target:
    """Import ``module:function`` and return the function."""
    module_name, _, attr = spec.partition(":")
    try:
        func = import_attr(spec)
    except ValueError:
        raise TargetError(f"target {spec!r}: expected module:function") from None
    except ImportError as err:
        raise TargetError(f"target {spec!r}: cannot import {module_name} ({err})") from None
    if not callable(func):
        raise TargetError(f"target {spec!r}: {module_name} has no callable {attr!r}")
    return func


def get(name: str) -> Target:
    """The built-in target called ``name`` (see :data:`BUILTINS`)."""
    if name not in BUILTINS:
        raise TargetError(f"unknown target {name!r}; built-in targets: {', '.join(BUILTINS)}")
    try:
        return load_callable(BUILTINS[name])
    except UndrivableTarget:
        raise
    except TargetError as err:
        hint = INSTALL_HINTS.get(name)
        raise TargetError(f"{err}; {hint}" if hint else str(err)) from None


def load_target(name: str) -> Target:
    """A built-in target, or ``module:function`` imported with the current directory
    on the path."""
    if ":" not in name:
        return get(name)
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        return load_callable(name)
    except TargetError:
        raise
    except Exception as err:  # the module itself failed while being imported
        reason = f"{type(err).__name__}: {err}"
        raise TargetError(f"target {name!r}: importing it failed ({reason})") from None
