"""``kvhit export`` for vLLM: a saved counterexample as a pytest file in vLLM's terms.

The file imports vLLM, torch and pytest only. A lookup (:class:`SavedLookup`) becomes
vLLM's KV cache specs, ``KVCacheConfig`` / ``KVCacheGroupSpec``, the coordinator
from ``get_kv_cache_coordinator``, the cached blocks put in its ``BlockPool`` under
the block hashes of a ``Request`` of tokens 0 … T-1, and one
``find_longest_cache_hit`` whose length and per-group blocks are asserted equal to
kvhit's spec answer, written into the file. A stateful program
(:class:`SavedProgram`) becomes a ``KVCacheManager`` and the calls the scheduler
makes, as :mod:`kvhit.engines.vllm.manager` makes them, with the assertion at the
operation that disagreed.

The configuration is the ``vllm`` target's (:mod:`kvhit.engines.vllm.target`, on
the drafters' default path): the same specs, flags and keywords. What differs between
releases is handled inside the file: a keyword a release may lack is passed only
where the installed signature takes it, and the API features the query needs
(:func:`kvhit.engines.vllm.release.refusal`, each feature turned off in turn) are
looked for, the file skipping itself with the reason where one is missing.

Requests and their block hashes are made as vLLM's own tests make them
(``tests/v1/core/test_prefix_caching.py``, read on vLLM's main branch at commit
003df296, after 0.34.0: ``init_none_hash(sha256)`` in an autouse fixture, and
``make_request``: a ``Request`` with ``SamplingParams`` and
``block_hasher=get_request_block_hasher(block_size, sha256)``), the ``Request``
keywords filtered by signature as :mod:`kvhit.engines.vllm.compat` does.

    >>> from kvhit.engines.pytest_writer import ExportEngine
    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 2, "eagle": True}],
    ...                  "cached": ["11"], "max_length": 3})
    >>> text = generate(SavedLookup("x.json", q, ExportEngine.VLLM))
    >>> "EXPECTED_LENGTH = 2" in text and "import kvhit" not in text
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from kvhit.engines.pytest_writer import (
    SavedLookup,
    SavedProgram,
    lookup_story,
    program_story,
    wrapped,
)
from kvhit.engines.vllm.divergences import DIVERGENCES
from kvhit.engines.vllm.options import EaglePath
from kvhit.engines.vllm.release import (
    EAGLE_WINDOW_ASSERT,
    MAX_MODEL_LEN,
    PARTIAL_HITS_FLAG,
    TWO_SPECS_ASSERT,
    Asker,
    Release,
    capabilities,
    coordinator_keywords,
    flagged,
    hash_block_size,
    hash_lookahead,
    is_draft,
    pool_size,
    scheduler_block_size,
    shared_lookahead,
)
from kvhit.errors import BadInput, Unsupported
from kvhit.model.spec import Answer, Group, Kind, Query, Upto, inclusive_window
from kvhit.targets.stateful import Finish

EVERY_FEATURE = Release(
    name="",
    coordinator_params=frozenset({"scheduler_block_size", "num_hash_lookahead_tokens"}),
    group_eagle_flag=True,
    draft_flag=True,
    mamba_cache_mode=True,
    eagle_window_needs_block_alignment=False,
    hybrid_needs_two_specs=False,
    partial_hash_hits=True,
    lookahead_hashes=True,
)
"""A release with every feature of :class:`Release` and none of its asserts: what a
query no release can be asked is refused by."""


@dataclass(frozen=True)
class Feature:
    """A feature some releases lack: the release without it (``without``: the fields
    of :data:`EVERY_FEATURE` that differ), the generated check that the installed vLLM
    has it, and why the query cannot be asked where it does not."""

    without: dict[str, Any]
    check: str
    why: str

    def needed(self, q: Query) -> bool:
        """Whether a release without this feature refuses ``q``."""
        return not capabilities(Asker(replace(EVERY_FEATURE, **self.without))).allows(q)


def without_param(name: str) -> dict[str, Any]:
    """The fields of a release whose coordinator lacks the keyword ``name``."""
    return {"coordinator_params": EVERY_FEATURE.coordinator_params - {name}}


FEATURES = (
    Feature(
        without_param("scheduler_block_size"),
        '"scheduler_block_size" in COORDINATOR_PARAMS',
        "get_kv_cache_coordinator takes no scheduler_block_size (0.23.0 and later): "
        "hits are aligned to the lcm of the block sizes",
    ),
    Feature(
        {"group_eagle_flag": False},
        '"is_eagle_group" in inspect.signature(KVCacheGroupSpec).parameters',
        "KVCacheGroupSpec has no is_eagle_group (0.20.0 and later): use_eagle makes "
        "every group drop",
    ),
    Feature(
        {"partial_hash_hits": False},
        f'source_says(kv_cache_coordinator.HybridKVCacheCoordinator.__init__, "{PARTIAL_HITS_FLAG}")',
        "no partial hash hits (0.26.0 and later): no hit inside a block",
    ),
    Feature(
        {**without_param("num_hash_lookahead_tokens"), "lookahead_hashes": False},
        '"num_hash_lookahead_tokens" in COORDINATOR_PARAMS',
        "no lookahead block hashes (num_hash_lookahead_tokens, 0.33.0 and later)",
    ),
    Feature(
        {"eagle_window_needs_block_alignment": True},
        "not source_says(single_type_kv_cache_manager.SlidingWindowManager"
        f'.find_longest_cache_hit, "{EAGLE_WINDOW_ASSERT}")',
        "its sliding window manager asserts that an eagle window's block size is the alignment",
    ),
    Feature(
        {"hybrid_needs_two_specs": True},
        "not source_says(kv_cache_coordinator.HybridKVCacheCoordinator"
        f'.verify_and_split_kv_cache_groups, "{TWO_SPECS_ASSERT}")',
        "its hybrid coordinator asserts that the groups have at least two different specs",
    ),
)
"""What a release may lack, oldest first as vLLM added them (the last two: asserts
later releases removed)."""

SPEC_CLASSES = {
    Kind.FULL: "FullAttentionSpec",
    Kind.SLIDING_WINDOW: "SlidingWindowSpec",
    Kind.CHUNKED_LOCAL: "ChunkedLocalAttentionSpec",
    Kind.MAMBA: "MambaSpec",
}


def spec_arguments(g: Group) -> str:
    """The keywords of a group's spec, as the ``vllm`` target builds it (a window
    inclusive, Mamba in ``align`` mode, a drafter's spec ``is_draft``)."""
    cls = SPEC_CLASSES[g.kind]
    parts = [f"block_size={g.block_size}"]
    if g.kind == Kind.SLIDING_WINDOW:
        parts.append(f"sliding_window={inclusive_window(g)}")
    if g.kind == Kind.CHUNKED_LOCAL:
        parts.append(f"attention_chunk_size={g.chunk}")
    if g.kind == Kind.MAMBA:
        parts += ["**MAMBA_STATE", f'**accepted({cls}, mamba_cache_mode="align")']
    else:
        parts.append("**ATTENTION")
    if is_draft(g):
        parts.append(f"**accepted({cls}, is_draft=True)")
    return ", ".join(parts)


def group_line(i: int, g: Group, groups: tuple[Group, ...]) -> str:
    """One ``KVCacheGroupSpec`` of the generated config."""
    flag = ", **accepted(KVCacheGroupSpec, is_eagle_group=True)" if flagged(g, groups) else ""
    spec = f"{SPEC_CLASSES[g.kind]}({spec_arguments(g)})"
    return f'        KVCacheGroupSpec(["layer.{i}"], {spec}{flag}),  # {g.describe()}'


def hashed_tokens(q: Query) -> int:
    """How many tokens of the request have block hashes: whole hash blocks, ending by
    T - La with lookahead hashes."""
    unit = hash_block_size(q)
    return (q.num_tokens - hash_lookahead(q, EaglePath.DEFAULT)) // unit * unit


def cached_rows(q: Query) -> tuple[list[list[int]], dict[int, int]]:
    """Per group, the whole blocks to put in vLLM's cache, and the fine boundary of
    each group's partially filled block: those the request's hashes reach (the
    spec never needs one past them)."""
    hashed = hashed_tokens(q)
    whole = [
        [j for j, e in enumerate(row) if e is True and (j + 1) * g.block_size <= hashed]
        for g, row in zip(q.groups, q.cached)
    ]
    partial = {
        i: e.end
        for i, row in enumerate(q.cached)
        for e in row
        if isinstance(e, Upto) and e.end <= hashed
    }
    return whole, partial


def coordinator_options(q: Query) -> str:
    """The keywords of ``get_kv_cache_coordinator``, as the ``vllm`` target passes them
    (each filtered by the installed signature in the generated file)."""
    options = coordinator_keywords(q, EaglePath.DEFAULT)
    return "".join(f"        {name}={value!r},\n" for name, value in options.items())


def requirements(q: Query) -> str:
    """The generated checks of the features the query needs."""
    needed = [f for f in FEATURES if f.needed(q)]
    return "".join(f"    ({f.check}, {json.dumps(f.why)}),\n" for f in needed)


def documented_classes(q: Query) -> str:
    """The documented divergences whose scope holds the query, with their releases."""
    found = [d for d in DIVERGENCES if d.scope(q)]
    if not found:
        return "No divergence kvhit documents holds this state."
    lines = ["kvhit documents this state's class (kvhit.engines.vllm.divergences):"]
    lines += [
        wrapped(f"- {d.name} ({d.verdict.label}; vLLM {d.first} … {d.last})", "  ") for d in found
    ]
    return "\n".join(lines)


def core_modules(q: Query) -> list[str]:
    """The modules of ``vllm.v1.core`` the generated file reads: the coordinator's, and
    the managers' where a check reads their code."""
    needed = [f for f in FEATURES if f.needed(q)]
    managers = any("single_type_kv_cache_manager" in f.check for f in needed)
    return ["kv_cache_coordinator", *(["single_type_kv_cache_manager"] * managers)]


def spec_imports(groups: tuple[Group, ...]) -> str:
    """The generated import of the config classes and the specs the groups use."""
    used = {SPEC_CLASSES[g.kind] for g in groups} | {"KVCacheConfig", "KVCacheGroupSpec"}
    return "".join(f"        {name},\n" for name in sorted(used))


def lookup_docstring(saved: SavedLookup) -> str:
    """The generated file's docstring after its title: the state explained and drawn,
    the documented classes that hold it, and where it came from."""
    return "\n\n".join(
        [
            lookup_story(saved, "vLLM"),
            documented_classes(saved.query),
            wrapped(
                f"Exported by `kvhit export {saved.source}`; kvhit's `vllm` target asks "
                "vLLM this query the same way (kvhit.engines.vllm.target)."
            ),
        ]
    )


SOURCE_SAYS = '''\
def source_says(func, text):
    """Whether the installed vLLM's code of `func` contains `text`."""
    return text in inspect.getsource(func)


'''


def source_check(q: Query) -> str:
    """The generated helper that reads vLLM's code, where a needed feature's check uses it."""
    return SOURCE_SAYS if any("source_says" in f.check for f in FEATURES if f.needed(q)) else ""


ALIGNMENT_CHECK = """\
    # With partial hash hits on, vLLM lands hits on hash units, else on the scheduler
    # block size; the query is asked only where that is A.
    partial = bool(getattr(coordinator, "enable_partial_hash_hits", False))
    if (HASH_BLOCK_SIZE if partial else SCHEDULER_BLOCK_SIZE) != ALIGNMENT:
        pytest.skip(f"vLLM {vllm.__version__} aligns these hits elsewhere (partial hash hits: {partial})")
"""


def alignment_check(q: Query) -> str:
    """The generated check of where vLLM lands the hits (the variable ``coordinator``
    set): needed where partial hash hits may turn on (a hash unit or a Mamba group)."""
    if q.hash_unit is None and not any(g.kind == Kind.MAMBA for g in q.groups):
        return ""
    return ALIGNMENT_CHECK


HEAD = '''\
"""{title}

{story}
"""

from __future__ import annotations

import inspect

import pytest
import torch

try:
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import {core_modules}
{manager_import}    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
{spec_classes}    )
    from vllm.v1.request import Request
except ImportError as err:
    pytest.skip(f"vLLM's prefix-cache code cannot be imported: {{err}}", allow_module_level=True)

ALIGNMENT = {alignment}  # A: a hit is a multiple of it
HASH_BLOCK_SIZE = {hash_block_size}
SCHEDULER_BLOCK_SIZE = {scheduler_block_size}
LOOKAHEAD_TOKENS = {lookahead}  # num_hash_lookahead_tokens
{constants}
ATTENTION = {{"num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}}
MAMBA_STATE = {{"shapes": ((1, 8),), "dtypes": (torch.float32,)}}
init_none_hash(sha256)  # the seed of every request's hashes: once, as vLLM's tests do


def accepted(func, **options):
    """The keyword options that `func` takes in the installed vLLM (releases differ)."""
    params = inspect.signature(func).parameters
    return {{name: value for name, value in options.items() if name in params}}


{source_says}COORDINATOR_PARAMS = inspect.signature(kv_cache_coordinator.get_kv_cache_coordinator).parameters
# What this query needs of vLLM's API (a release without it cannot be asked the query)
NEEDED = [
    ("hash_block_size" in COORDINATOR_PARAMS, "get_kv_cache_coordinator takes no hash_block_size (0.14.0 and later)"),
{requirements}]
MISSING = "; ".join(why for present, why in NEEDED if not present)
if MISSING:
    pytest.skip(f"vLLM {{vllm.__version__}} cannot be asked this query: {{MISSING}}", allow_module_level=True)


def kv_cache_groups():
    """One KV cache group per row of the drawing."""
    return [
{groups}
    ]


def request(request_id, tokens):
    """A request of these tokens, its block hashes computed by vLLM's own hasher."""
    hasher = get_request_block_hasher(
        HASH_BLOCK_SIZE, sha256, **accepted(get_request_block_hasher, num_hash_lookahead_tokens=LOOKAHEAD_TOKENS)
    )
    options = accepted(Request, pooling_params=None, eos_token_id=None, block_hasher=hasher)
    return Request(request_id, list(tokens), SamplingParams(max_tokens=1), **options)
'''

LOOKUP_CONSTANTS = """\
NUM_TOKENS = {num_tokens}  # T: the request is tokens 0 … T-1
MAX_LENGTH = {max_length}  # M: the longest hit asked for (vLLM's max_cache_hit_length)
NUM_BLOCKS = {num_blocks}  # enough for the cached blocks, and vLLM's null block
CACHED = {cached}  # per group: the whole blocks in vLLM's prefix cache
PARTIAL = {partial}  # per group: the fine boundary of a partially filled block
{expected}"""

EXPECTED = """\
# The correct answer, computed by `kvhit export` (kvhit.model.spec.longest_hit, the
# spec, on {on}): the longest valid hit L* and the blocks each group reuses there.
EXPECTED_LENGTH = {length}
EXPECTED_BLOCKS = {blocks}
"""

LOOKUP_BODY = '''

def put_in_cache(pool, req, group_id, block_size):
    """Cache group `group_id`'s blocks of CACHED and PARTIAL under the request's hashes,
    as vLLM caches a request's blocks (a null block in between is skipped)."""
    cached = CACHED[group_id]
    fresh = iter(pool.get_new_blocks(len(cached)))
    blocks = [next(fresh) if j in cached else pool.null_block for j in range(max(cached, default=-1) + 1)]
    pool.cache_full_blocks(req, blocks, 0, len(blocks), block_size, group_id)
    if group_id in PARTIAL:
        (block,) = pool.get_new_blocks(1)
        pool.cache_partial_block(req, block, PARTIAL[group_id], group_id, block_size)


def test_find_longest_cache_hit_is_the_longest_valid_hit():
    config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups())
    options = dict(
{options}    )
    get_coordinator = kv_cache_coordinator.get_kv_cache_coordinator
    try:
        coordinator = get_coordinator(config, **accepted(get_coordinator, **options))
    except ValueError as err:  # vLLM's own checks of a configuration
        pytest.skip(f"vLLM {{vllm.__version__}} refuses this configuration: {{err}}")
{alignment_check}    req = request("0", range(NUM_TOKENS))
    for group_id, group in enumerate(config.kv_cache_groups):
        put_in_cache(coordinator.block_pool, req, group_id, group.kv_cache_spec.block_size)

    blocks, length, *_ = coordinator.find_longest_cache_hit(req.block_hashes, MAX_LENGTH)

    reused = [[j for j, block in enumerate(group) if not block.is_null] for group in blocks]
    assert (length, reused) == (EXPECTED_LENGTH, EXPECTED_BLOCKS), (
        f"vLLM {{vllm.__version__}} reuses {{length}} tokens, blocks {{reused}}; the longest "
        f"valid hit is {{EXPECTED_LENGTH}} tokens, blocks {{EXPECTED_BLOCKS}}"
    )
'''

PROGRAM_CONSTANTS = """\
MAX_MODEL_LEN = {max_model_len}
NUM_BLOCKS = {num_blocks}  # the pool's usable blocks and vLLM's null block
BLOCK_SIZES = {block_sizes}
{state}{expected}"""

STATE = """\
# What vLLM's cache held for the last request when the program was saved: the state
# the correct answer below is computed on
STATE = {state}
"""

PROGRAM_BODY = '''

def make_manager():
    """vLLM's KVCacheManager for these groups, as its scheduler builds one."""
    config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups())
    options = dict(
        max_model_len=MAX_MODEL_LEN,
        hash_block_size=HASH_BLOCK_SIZE,
        enable_caching=True,
        scheduler_block_size=SCHEDULER_BLOCK_SIZE,
        use_eagle={use_eagle},
        num_hash_lookahead_tokens=LOOKAHEAD_TOKENS,
    )
    try:
        manager = KVCacheManager(config, **accepted(KVCacheManager, **options))
    except (AssertionError, ValueError) as err:  # vLLM's own checks of a configuration
        pytest.skip(f"vLLM {{vllm.__version__}} refuses this configuration: {{err}}")
{alignment_check}    return manager


def admit(manager, running, request_id, tokens):
    """What vLLM's scheduler does for a new prompt, in a step of its own: look its
    prefix up, allocate and cache its blocks, then drop the blocks that left a window.
    The hit: its length and each group's reused block indices (None: the pool cannot
    hold the prompt)."""
    if hasattr(manager, "new_step_starts"):
        manager.new_step_starts()
    req = request(str(request_id), tokens)
    hit, length = manager.get_computed_blocks(req)[:2]
    must_fit = accepted(manager.allocate_slots, full_sequence_must_fit=True)
    if manager.allocate_slots(req, len(tokens) - length, length, hit, **must_fit) is None:
        return None
    req.num_computed_tokens = len(tokens)
    manager.remove_skipped_blocks(req.request_id, len(tokens))
    running[request_id] = req
    return length, [[j for j, block in enumerate(group) if not block.is_null] for group in hit.blocks]


def finish(manager, running, request_id):
    """Free a running request's blocks (they stay cached until evicted)."""
    if request_id in running:
        manager.free(running.pop(request_id))


def cached_state(manager, tokens):
    """What vLLM's cache holds of a request of these tokens, per group and block, each
    looked up by its hash: true (cached whole), false, or {{"upto": p}} (a partial entry
    up to token p, read where vLLM's lookup reads them)."""
    hashes = request("state", tokens).block_hashes
    partial_hits = bool(getattr(manager.coordinator, "enable_partial_hash_hits", False))
    state = []
    for group_id, block_size in enumerate(BLOCK_SIZES):
        per = block_size // HASH_BLOCK_SIZE
        view = hashes if per == 1 else BlockHashListWithBlockSize(hashes, HASH_BLOCK_SIZE, block_size)

        def cached(key):
            return manager.block_pool.get_cached_block(key, [group_id]) is not None

        row = []
        for j in range(len(view)):
            fine = [k for k in range(1, per) if partial_hits and cached(hashes[j * per + k - 1])]
            upto = {{"upto": j * block_size + fine[-1] * HASH_BLOCK_SIZE}} if fine else False
            row.append(True if cached(view[j]) else upto)
        state.append(row)
    return state


def test_the_program_runs_and_its_last_lookup_is_the_longest_valid_hit():
    manager = make_manager()
    running = {{}}
{ops}'''

STATE_CHECK = """\
    state = cached_state(manager, {tokens})
    if state != STATE:
        pytest.skip(
            f"vLLM {{vllm.__version__}}'s cache holds {{state}} for the last request, not the "
            f"saved {{STATE}}: the correct answer is known for the saved state only"
        )
"""

PROGRAM_ASSERT = """\
    assert hit == (EXPECTED_LENGTH, EXPECTED_BLOCKS), (
        f"vLLM {vllm.__version__} answers {hit} (hit length, blocks); the longest valid hit "
        f"is {EXPECTED_LENGTH} tokens, blocks {EXPECTED_BLOCKS}"
    )
"""


def head(title: str, story: str, q: Query, constants: str, manager: bool = False) -> str:
    """The generated file up to its test: docstring, imports (``KVCacheManager`` with
    ``manager``), the checks of what the installed vLLM has, the groups and the request."""
    manager_import = (
        "    from vllm.v1.core.kv_cache_manager import KVCacheManager\n"
        "    from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize\n"
    )
    return HEAD.format(
        title=title,
        manager_import=manager_import if manager else "",
        story=story,
        core_modules=", ".join(core_modules(q)),
        spec_classes=spec_imports(q.groups),
        alignment=q.alignment,
        hash_block_size=hash_block_size(q),
        scheduler_block_size=scheduler_block_size(q),
        lookahead=hash_lookahead(q, EaglePath.DEFAULT),
        constants=constants,
        source_says=source_check(q),
        requirements=requirements(q),
        groups="\n".join(group_line(i, g, q.groups) for i, g in enumerate(q.groups)),
    )


def expected(answer: Answer | None, on: str) -> str:
    """The generated constants of the correct answer (none without one)."""
    if answer is None:
        return ""
    return EXPECTED.format(on=on, length=answer.length, blocks=[list(b) for b in answer.blocks])


def asked_somewhere(source: str, q: Query) -> None:
    """BadInput if no vLLM release can be asked ``q`` (a lookup, or a program's shape)."""
    reason = capabilities(Asker(EVERY_FEATURE)).refusal(q)
    if reason is not None:
        raise BadInput(f"{source}: no vLLM release can be asked this: {reason}")


def lookup_file(saved: SavedLookup) -> str:
    """The pytest file of a saved lookup."""
    q = saved.query
    asked_somewhere(saved.source, q)
    whole, partial = cached_rows(q)
    constants = LOOKUP_CONSTANTS.format(
        num_tokens=q.num_tokens,
        max_length=q.max_length,
        num_blocks=pool_size(q),
        cached=whole,
        partial=partial,
        expected=expected(saved.correct, "this state"),
    )
    title = "vLLM's find_longest_cache_hit on one cache state, against the longest valid hit."
    body = LOOKUP_BODY.format(options=coordinator_options(q), alignment_check=alignment_check(q))
    return head(title, lookup_docstring(saved), q, constants) + body


def op_lines(saved: SavedProgram) -> str:
    """The program's operations as calls, the last one (which disagreed) marked and
    followed by the assertion when it is a lookup with a correct answer."""
    lines = []
    ops = saved.program.ops
    for number, op in enumerate(ops, 1):
        last = number == len(ops)
        mark = f"  # {number}. <- {saved.cls}" if last else f"  # {number}."
        if isinstance(op, Finish):
            lines.append(f"    finish(manager, running, {op.request}){mark}")
            continue
        call = f"admit(manager, running, {op.request}, {list(op.tokens)})"
        checked = last and saved.correct is not None
        if checked:
            lines.append(STATE_CHECK.format(tokens=list(op.tokens)).rstrip("\n"))
        lines.append(f"    hit = {call}{mark}" if last else f"    {call}{mark}")
        if checked:
            lines.append(PROGRAM_ASSERT)
    return "\n".join(lines) + "\n"


def program_file(saved: SavedProgram) -> str:
    """The pytest file of a saved stateful program."""
    p = saved.program
    if not p.ops:
        raise BadInput(f"{saved.source}: the engine's creation failed; no operation to export")
    shape = Query(p.groups, tuple(() for _ in p.groups), 0, 1, p.alignment, p.hash_unit)
    asked_somewhere(saved.source, shape)
    try:
        shared_lookahead(p.groups)
    except Unsupported as err:
        raise BadInput(f"{saved.source}: no vLLM release can be asked this: {err}") from None
    state = "" if saved.snapshot is None else STATE.format(state=saved.snapshot.to_json()["cached"])
    constants = PROGRAM_CONSTANTS.format(
        max_model_len=MAX_MODEL_LEN,
        num_blocks=p.num_blocks + 1,
        block_sizes=[g.block_size for g in p.groups],
        state=state,
        expected=expected(saved.correct, "vLLM's cache at the last lookup"),
    )
    title = "vLLM's KVCacheManager serving a program of requests, against the longest valid hit."
    story = "\n\n".join(
        [
            program_story(saved, "vLLM"),
            wrapped(
                f"Exported by `kvhit export {saved.source}`; kvhit's stateful `vllm` target "
                "drives vLLM the same way (kvhit.engines.vllm.manager)."
            ),
        ]
    )
    check = alignment_check(shape)
    body = PROGRAM_BODY.format(
        use_eagle=any(g.eagle for g in p.groups),
        alignment_check=check and f"    coordinator = manager.coordinator\n{check}",
        ops=op_lines(saved),
    )
    return head(title, story, shape, constants, manager=True) + body


def generate(saved: SavedLookup | SavedProgram) -> str:
    """The pytest file, in vLLM's terms, of a saved counterexample; :class:`BadInput`
    if no vLLM release can be asked it or what disagreed does not show in vLLM's calls."""
    if isinstance(saved, SavedLookup):
        return lookup_file(saved)
    return program_file(saved)
