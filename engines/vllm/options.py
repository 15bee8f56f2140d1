"""The options the vLLM built-ins take (``--option NAME=VALUE``), as data: light, so the
registry and the CLI can name them without importing vLLM.

- ``eagle`` (targets ``vllm``, ``vllm-undocumented``): how a query's drafters are run
  (:class:`EaglePath`).
- ``divergent`` (target ``vllm-connector``): what kvhit's connector says to vLLM's
  ``supports_divergent_local_hybrid_hits`` (:class:`DivergentHits`).

    >>> EAGLE.default, DIVERGENT.values
    ('default', ('auto', 'on', 'off'))
"""

from __future__ import annotations

from enum import StrEnum

from kvhit.contract import Option


class EaglePath(StrEnum):
    """How the ``vllm`` target runs a query's drafters (option ``eagle``).

    ``default``: a query's drafters as it states them: a ``drop`` drafter gets the
    eagle drop (what vLLM runs through 0.32, and from 0.33 with
    ``disable_lookahead_block_hashes``), a ``lookahead`` one lookahead block hashes
    (0.33+, vLLM's default for EAGLE/MTP there: ``_resolve_num_hash_lookahead_tokens``,
    ``config/vllm.py``, 0.34.0). ``drop``: the path of a model whose drafter drops on
    every release: the target declares no ``lookahead`` drafter, since vLLM would answer
    such a query as another one (its drafters dropping), which the spec of this one
    does not judge.
    """

    DEFAULT = "default"
    DROP = "drop"


class DivergentHits(StrEnum):
    """What kvhit's connector says to ``supports_divergent_local_hybrid_hits`` (vLLM
    0.28.0+, ``KVConnectorBase_V1``; option ``divergent``)."""

    AUTO = "auto"
    """Claimed when some tier of the query holds the Mamba kind, as vLLM's NIXL,
    Mooncake and MoRIIO connectors claim it when they carry the recurrent state."""
    ON = "on"
    OFF = "off"


EAGLE = Option(
    "eagle",
    tuple(map(str, EaglePath)),
    "run drafters as vLLM does on the release's defaults (default), or as a model whose "
    "drafter drops on every release (drop: vLLM's disable_lookahead_block_hashes; no "
    "lookahead drafter is drawn)",
)
DIVERGENT = Option(
    "divergent",
    tuple(map(str, DivergentHits)),
    "what kvhit's connector says to supports_divergent_local_hybrid_hits: claimed when "
    "a tier holds the Mamba kind (auto), always (on) or never (off)",
)

LOOKUP_OPTIONS = (EAGLE,)
"""The options of targets ``vllm`` and ``vllm-undocumented``."""
CONNECTOR_OPTIONS = (DIVERGENT,)
"""The options of target ``vllm-connector``."""
