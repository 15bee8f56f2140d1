"""The ``vllm-connector`` target: vLLM's own scheduler deciding a hit that its KV
connector path can extend from outside the pool (tiered queries, docs/design.md §1.7).

What is driven, for each query (nothing of vLLM is restated):

1. vLLM's real ``Scheduler`` (``v1/core/sched/scheduler.py``), built on CPU from a
   ``VllmConfig`` whose ``kv_transfer_config`` names kvhit's connector
   (:class:`kvhit.engines.vllm.kv_connector.TieredConnector`, created by vLLM's
   ``KVConnectorFactory``), and the query's ``KVCacheConfig`` (the ``vllm`` target's
   specs, :func:`kvhit.engines.vllm.target.kv_cache_config`, with room for the
   request's own blocks). vLLM's ``ModelConfig`` needs a model: a two-layer config
   whose architecture is :class:`KvhitForCausalLM`, registered with vLLM's
   ``ModelRegistry``; the scheduler never runs a model.
2. The local state is built in the scheduler's own block pool as the ``vllm`` target
   builds it (:func:`kvhit.engines.vllm.target.mark_cached`), from the query's local
   rows (:func:`kvhit.model.spec.local_query`).
3. A request of tokens 0 … M (vLLM's ``Request`` with vLLM's block hasher; vLLM bounds
   a hit at the prompt's length minus one, :func:`prompt_length`) is added
   and ``Scheduler.schedule()`` is run once. Everything on the path is vLLM's:
   the local lookup (``get_computed_blocks``; with a connector and Mamba layers, the
   per-group lookup ``find_longest_cache_hit_per_group`` and ``max`` of its hits in
   0.24-0.26, ``get_computed_blocks_for_connector`` from 0.27, behind
   ``supports_divergent_local_hybrid_hits`` from 0.28), the call to the connector,
   the sub-block tail trim (``truncate_computed_blocks``, 0.27+) and the
   ``hit_diverged`` fallback to ``get_computed_blocks`` (0.27+).
4. The answer is read from what the scheduler settled on: ``allocate_slots`` is
   observed (called through unchanged) for the local tokens and blocks it was given,
   the connector for the external tokens it was told to load
   (``update_state_after_alloc``). ``length`` is local + external; ``blocks`` per
   group are the local blocks vLLM took (non-null entries of ``new_computed_blocks``)
   together with the blocks the connector loads past the local boundary
   (:func:`kvhit.engines.vllm.kv_connector.loaded_blocks`).

What it declares (:func:`connector_capabilities`): tiers; no drafters (vLLM's
scheduler takes them from a speculative config, which needs a drafter model); no
prompt longer than :data:`kvhit.engines.vllm.release.MAX_MODEL_LEN`; and the ``vllm``
target's rules as vLLM's scheduler asks (partial hash hits at their default,
:func:`kvhit.engines.vllm.release.capabilities`). A release before 0.24.0 (no
per-group lookup, so no connector path for divergent hybrid hits) cannot be driven.
The built-in is :func:`vllm_connector_lookup`, called with the target's options
(:data:`kvhit.engines.vllm.options.CONNECTOR_OPTIONS`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Any

import torch

from kvhit.contract import Capabilities, QueryTarget, Rule
from kvhit.engines.vllm.compat import accepted
from kvhit.engines.vllm.kv_connector import TieredConnector, loaded_blocks
from kvhit.engines.vllm.manager import new_request
from kvhit.engines.vllm.options import DIVERGENT, DivergentHits
from kvhit.engines.vllm.release import (
    MAX_MODEL_LEN,
    Asker,
    Release,
    capabilities,
    hash_block_size,
    import_failure,
    scheduler_block_size,
)
from kvhit.errors import UndrivableTarget, Unsupported
from kvhit.model.spec import Kind, Query, local_query

try:
    from vllm import ModelRegistry
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from kvhit.engines.vllm.target import (
        RELEASE,
        foreseen,
        kv_cache_config,
        mark_cached,
        request_hashes,
    )
except ImportError as err:
    raise import_failure(err) from None

for _name in ("vllm", "vllm.distributed", "vllm.v1"):
    logging.getLogger(_name).setLevel(logging.ERROR)

CONNECTOR = "kvhit.engines.vllm.kv_connector"
"""The module vLLM's connector factory imports kvhit's connector from."""


class ConnectorPath(StrEnum):
    """What vLLM's scheduler hands a connector as the local hit of a hybrid model with
    Mamba layers (``v1/core/sched/scheduler.py`` and ``v1/core/kv_cache_manager.py``),
    found from the release's API (:func:`connector_path`)."""

    NONE = "none"
    """Before 0.24.0: no per-group lookup (``find_longest_cache_hit_per_group``)."""
    MAX_OF_GROUPS = "max_of_groups"
    """0.24.0-0.26.0: ``max`` of the per-group hits, inline in ``schedule()``, and the
    per-group blocks (vLLM #46453)."""
    FULL_ATTENTION_HIT = "full_attention_hit"
    """0.27.0: ``get_computed_blocks_for_connector`` for every connector: the full
    attention hit when no group hits deeper (else the reconciled hit), and when it ran
    deeper than a lagging group and the connector finds no tokens, the ``hit_diverged``
    fallback to ``get_computed_blocks`` (vLLM PR #48425)."""
    FLAGGED = "flagged"
    """0.28.0+: as 0.27.0 for a connector that claims
    ``supports_divergent_local_hybrid_hits``; the reconciled hit
    (``get_computed_blocks``) for any other (``_get_local_prefix_cache_hit``)."""


def connector_path() -> ConnectorPath:
    """The installed release's :class:`ConnectorPath`."""
    if not hasattr(HybridKVCacheCoordinator, "find_longest_cache_hit_per_group"):
        return ConnectorPath.NONE
    if not hasattr(KVCacheManager, "get_computed_blocks_for_connector"):
        return ConnectorPath.MAX_OF_GROUPS
    if not hasattr(Scheduler, "_get_local_prefix_cache_hit"):
        return ConnectorPath.FULL_ATTENTION_HIT
    return ConnectorPath.FLAGGED


PATH = connector_path()
"""The installed release's connector path."""


class KvhitForCausalLM(torch.nn.Module):
    """The architecture vLLM's ``ModelConfig`` resolves through its registry. vLLM
    inspects the class for the methods a text generator has; the scheduler never
    builds or runs it, so each raises."""

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Never called: the scheduler runs no model."""
        raise NotImplementedError("kvhit drives vLLM's scheduler only")

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Never called: the scheduler runs no model."""
        raise NotImplementedError("kvhit drives vLLM's scheduler only")

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Never called: the scheduler runs no model."""
        raise NotImplementedError("kvhit drives vLLM's scheduler only")


HF_CONFIG = {
    "architectures": [KvhitForCausalLM.__name__],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": MAX_MODEL_LEN,
    "torch_dtype": "float32",
    "rms_norm_eps": 1e-5,
}
"""The Hugging Face config of the model vLLM's ``ModelConfig`` reads (only its length
limit and architecture matter to the scheduler)."""


@cache
def model_dir() -> str:
    """A directory holding :data:`HF_CONFIG` as ``config.json``, the architecture
    registered with vLLM (once per process)."""
    ModelRegistry.register_model(KvhitForCausalLM.__name__, KvhitForCausalLM)
    path = Path(tempfile.mkdtemp(prefix="kvhit-vllm-model-"))
    (path / "config.json").write_text(json.dumps(HF_CONFIG))
    return str(path)


MAX_SEQS = 4
"""The most requests vLLM's scheduler runs at once here (``max_num_seqs``, at most the
token budget, as ``SchedulerConfig`` asks); more wait in its queue."""


@lru_cache(maxsize=16)
def vllm_config(
    block_size: int,
    mamba: bool,
    divergent: str | None,
    budget: int = MAX_MODEL_LEN,
    asynchronous: bool | None = None,
) -> VllmConfig:
    """vLLM's config for a scheduler of ``block_size`` tokens per scheduler block,
    prefix caching on, Mamba states cached at block boundaries (``align``, where the
    release's ``CacheConfig`` has ``mamba_cache_mode``) when the model has Mamba layers,
    and kvhit's connector with its capability flag ``divergent`` (None: no connector).
    ``budget`` is the token budget of a step (``max_num_batched_tokens``, chunked
    prefill on) and ``asynchronous`` vLLM's ``async_scheduling`` (None: vLLM decides,
    ``VllmConfig.__post_init__``)."""
    model = ModelConfig(
        model=model_dir(), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, dtype="float32"
    )
    scheduler = SchedulerConfig(
        max_num_seqs=min(MAX_SEQS, budget),
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=asynchronous,
    )
    mode = {"mamba_cache_mode": "align"} if mamba else {}
    cache_config = CacheConfig(
        block_size=block_size, enable_prefix_caching=True, **accepted(CacheConfig, mode)
    )
    transfer = None
    if divergent is not None:
        transfer = KVTransferConfig(
            kv_connector=TieredConnector.__name__,
            kv_connector_module_path=CONNECTOR,
            kv_role="kv_both",
            kv_connector_extra_config={"divergent_hits": divergent},
        )
    return VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=transfer,
    )


def prompt_length(q: Query) -> int:
    """The length of the request vLLM's scheduler is given: M + 1 tokens, since it
    bounds a hit at the prompt's length minus one (``Request.get_max_cache_hit_length``).
    Without a drafter, no hit of at most M reads a token past M, so this request has
    the hits of one of T tokens."""
    return q.max_length + 1


def within_model_length(q: Query) -> str | None:
    """The request (:func:`prompt_length`) fits vLLM's ``max_model_len``."""
    if prompt_length(q) > MAX_MODEL_LEN:
        return f"longer than max_model_len ({MAX_MODEL_LEN})"
    return None


def connector_capabilities(release: Release) -> Capabilities:
    """What the ``vllm-connector`` target can ask vLLM ``release`` (module docstring):
    tiers, no drafters, the ``vllm`` target's rules as the scheduler asks.

    >>> caps = connector_capabilities(RELEASE)
    >>> caps.tiers, sorted(caps.drafters), caps.rules[0].name
    (True, [], 'within_model_length')
    """
    local = capabilities(Asker(release))
    return Capabilities(
        drafters=frozenset(),
        hash_units=local.hash_units,
        tiers=True,
        rules=(Rule(within_model_length.__name__, within_model_length), *local.rules),
    )


CAPABILITIES = connector_capabilities(RELEASE)
"""What the ``vllm-connector`` target can ask the installed release."""


def driven() -> None:
    """:class:`UndrivableTarget` if the installed release has no connector path."""
    if PATH == ConnectorPath.NONE:
        raise UndrivableTarget(
            f"vLLM {RELEASE.name} has no connector path for divergent hybrid hits "
            "(find_longest_cache_hit_per_group, 0.24.0 and later)"
        )


def build_scheduler(q: Query, num_blocks: int, divergent: DivergentHits) -> Scheduler:
    """vLLM's scheduler for ``q``'s groups with a pool of ``num_blocks`` blocks (null
    block included) and kvhit's connector, saying ``divergent`` to
    ``supports_divergent_local_hybrid_hits``; :class:`Unsupported` where vLLM refuses
    the configuration while building it."""
    mamba = any(g.kind == Kind.MAMBA for g in q.groups)
    config = vllm_config(scheduler_block_size(q), mamba, str(divergent))
    return make_scheduler(q, num_blocks, config, Scheduler)


def make_scheduler(
    q: Query, num_blocks: int, config: VllmConfig, cls: type[Scheduler] = Scheduler
) -> Scheduler:
    """vLLM's scheduler of class ``cls`` (``Scheduler`` or a subclass, as vLLM's
    ``SchedulerConfig.scheduler_cls`` names it) for ``q``'s groups (the ``vllm``
    target's specs, :func:`kvhit.engines.vllm.target.kv_cache_config`) with a pool of
    ``num_blocks`` blocks (null block included), configured by ``config``, hashing at
    ``q``'s hash unit (``hash_block_size``, 0.20.0+; before, vLLM's scheduler hashes at
    its block size); :class:`Unsupported` where vLLM refuses the configuration while
    building it."""
    block_size = scheduler_block_size(q)
    pool = replace(kv_cache_config(q), num_blocks=num_blocks)
    config.cache_config.num_gpu_blocks = num_blocks
    try:
        built = cls(
            vllm_config=config,
            kv_cache_config=pool,
            structured_output_manager=StructuredOutputManager(config),
            block_size=block_size,
            log_stats=False,
            **accepted(Scheduler.__init__, {"hash_block_size": hash_block_size(q)}),
        )
    except (AssertionError, ValueError) as err:
        raise Unsupported(f"vLLM {RELEASE.name} refuses this configuration: {err}") from None
    foreseen(built.kv_cache_manager.coordinator, q, Asker(RELEASE))
    return built


def scheduler(q: Query, divergent: DivergentHits) -> Scheduler:
    """:func:`build_scheduler` with a pool large enough for the query's cached blocks
    and the request's own."""
    own = sum(-(-prompt_length(q) // g.block_size) + 1 for g in q.groups)
    return build_scheduler(q, kv_cache_config(q).num_blocks + own, divergent)


@dataclass
class Settled:
    """What the scheduler gave ``allocate_slots`` for the request: the local tokens
    and blocks (None until it is called)."""

    local: int | None = None
    blocks: list[list[int]] | None = None


def observe(built: Scheduler) -> Settled:
    """Record the local hit the scheduler hands ``allocate_slots``, calling it through."""
    settled = Settled()
    manager = built.kv_cache_manager
    allocate = manager.allocate_slots

    def recorded(request: Request, *args: Any, **kwargs: Any) -> Any:
        computed = kwargs.get("new_computed_blocks")
        settled.local = kwargs.get("num_new_computed_tokens", 0)
        if computed is not None:
            settled.blocks = [
                [j for j, b in enumerate(group) if not b.is_null] for group in computed.blocks
            ]
        return allocate(request, *args, **kwargs)

    manager.allocate_slots = recorded
    return settled


def vllm_request(q: Query, block_size: int) -> Request:
    """vLLM's request of tokens 0 … M (:func:`prompt_length`), hashed by vLLM's own
    block hasher."""
    hasher = get_request_block_hasher(block_size, sha256)
    return new_request("kvhit", range(prompt_length(q)), hasher)


def connector_answer(q: Query, divergent: DivergentHits = DivergentHits.AUTO) -> dict[str, Any]:
    """What vLLM's scheduler settles on for ``q`` (module docstring), its connector
    saying ``divergent``: ``length`` (local + external tokens) and ``blocks`` per group;
    :class:`Unsupported` with the reason where :data:`CAPABILITIES` refuse ``q``;
    :class:`UndrivableTarget` on a release with no connector path."""
    driven()
    reason = CAPABILITIES.refusal(q)
    if reason is not None:
        raise Unsupported(reason)
    built = scheduler(q, divergent)
    pool = built.kv_cache_manager.block_pool
    local = local_query(q)
    mark_cached(
        built.kv_cache_manager.coordinator,
        local,
        request_hashes(prompt_length(q), pool.hash_block_size),
    )
    connector = built.connector
    assert isinstance(connector, TieredConnector)
    connector.serve(q)
    settled = observe(built)
    built.add_request(vllm_request(q, pool.hash_block_size))
    output = built.schedule()
    if not output.scheduled_new_reqs or settled.local is None or settled.blocks is None:
        raise RuntimeError("vLLM's scheduler did not schedule the request")
    length = output.scheduled_new_reqs[0].num_computed_tokens
    loads = loaded_blocks(q, settled.local, length)
    blocks = [sorted(set(took) | set(load)) for took, load in zip(settled.blocks, loads)]
    return {"length": length, "blocks": blocks}


def vllm_connector_lookup(options: Mapping[str, str]) -> QueryTarget:
    """The ``vllm-connector`` target with ``options`` (every one of
    :data:`kvhit.engines.vllm.options.CONNECTOR_OPTIONS`); :class:`UndrivableTarget`
    on a release with no connector path."""
    driven()
    divergent = DivergentHits(options[DIVERGENT.name])
    return QueryTarget(partial(connector_answer, divergent=divergent), CAPABILITIES)
