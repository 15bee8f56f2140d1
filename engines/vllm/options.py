"""The options the vLLM built-ins take (``--option NAME=VALUE``), as data: light, so the
registry and the CLI can name them without importing vLLM.

- ``eagle`` (targets ``vllm``, ``vllm-undocumented``): how a query's drafters are run
  (:class:`EaglePath`).
- ``divergent`` (target ``vllm-connector``): what kvhit's connector says to vLLM's
  ``supports_divergent_local_hybrid_hits`` (:class:`DivergentHits`).
- ``cuts`` (target ``vllm-scheduler``): whether kvhit's executor may drop an aborted
  request's part of a step in flight (:class:`InFlightAborts`).

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


class InFlightAborts(StrEnum):
    """What kvhit's executor does with a step part of a request aborted while the step
    is in flight (option ``cuts`` of ``vllm-scheduler``)."""

    RUN = "run"
    """It runs, as vLLM's model runner runs every step the scheduler sent: never cut."""
    DROP = "drop"
    """It may never run, as vLLM #56525 reports in production (a client abort
    mid-prefill, Kimi-K3 on vLLM's V2 model runner): steps are cut."""


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

CUTS = Option(
    "cuts",
    tuple(map(str, InFlightAborts)),
    "whether an aborted request's part of a step in flight still runs (run: vLLM's "
    "model runner) or may never run (drop: vLLM #56525's production report)",
)

LOOKUP_OPTIONS = (EAGLE,)
"""The options of targets ``vllm`` and ``vllm-undocumented``."""
CONNECTOR_OPTIONS = (DIVERGENT,)
"""The options of target ``vllm-connector``."""
SCHEDULER_OPTIONS = (CUTS,)
"""The options of target ``vllm-scheduler``."""
