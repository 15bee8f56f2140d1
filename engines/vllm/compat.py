"""The parts of vLLM's ``KVCacheManager`` API that differ between releases 0.14.0 and
0.34.0, found from signatures (read in each release's wheel), not release numbers.

What the stateful target (:mod:`kvhit.engines.vllm.manager`) meets, read in the wheels
of 0.14.0 … 0.34.0 (``vllm/v1/core/kv_cache_manager.py``, ``kv_cache_utils.py``,
``vllm/v1/request.py``):

- ``KVCacheManager.__init__``: ``max_num_batched_tokens`` (0.20-0.25, renamed
  ``max_in_flight_tokens`` from 0.26; both default to ``max_model_len``),
  ``scheduler_block_size`` (0.23+), ``num_hash_lookahead_tokens`` (lookahead block
  hashes, 0.33+);
- ``get_request_block_hasher``: ``num_hash_lookahead_tokens`` (0.33+);
- ``Request.__init__``: ``eos_token_id`` (0.14-0.16, required);
- ``KVCacheManager.allocate_slots``: ``full_sequence_must_fit`` (0.21+; before, the
  call allocates every new token it is given, which is the same gate here);
- ``KVCacheManager.new_step_starts`` (0.17+), which the scheduler calls at each step:
  until it is called, Mamba asks for more blocks than the pool has rather than reuse
  a block cached in the same step;
- ``get_computed_blocks`` answers ``(blocks, length)`` up to 0.25 and adds the shared
  prefix boundary from 0.26;
- a group's view of the request's hashes: ``BlockHashListWithBlockSize`` in every
  release (``resolve_block_hashes``, which wraps it, is 0.26+, the name whose import
  failed under 0.20.0; the view's block key is the units' hashes joined up to 0.23
  and the last unit's hash from 0.24).

    >>> def f(a, *, b=0):
    ...     return a, b
    >>> accepted(f, {"b": 1, "c": 2}), takes(f, "c")
    ({'b': 1}, False)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=256)
def parameters(func: Callable[..., Any]) -> frozenset[str]:
    """The names of ``func``'s parameters (a class: its constructor's), read once: a
    signature costs more than a scheduler step."""
    return frozenset(inspect.signature(func).parameters)


def takes(func: Callable[..., Any], name: str) -> bool:
    """Whether ``func`` (a class: its constructor) has a parameter called ``name``."""
    return name in parameters(func)


def accepted(func: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The keyword ``options`` that ``func`` takes in the installed release."""
    params = parameters(func)
    return {name: value for name, value in options.items() if name in params}
