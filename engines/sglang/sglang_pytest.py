"""``kvhit export`` for SGLang: a saved lookup as a pytest file in SGLang's terms.

The file imports SGLang, torch and pytest only. It builds SGLang's hybrid radix cache
(``UnifiedRadixCache``) on CPU with the pools the query's groups need, inserts the
query's state page by page as a prefill inserts a request (a window page whose KV is
not cached freed first and marked evicted, a Mamba state at every page end), evicts
the Mamba states that are not cached with the cached ones locked, asks
``match_prefix`` for the request's first M tokens, and asserts the hit and the pages
each group reuses equal kvhit's spec answer, written into the file. The state is
built as the ``sglang`` target builds it (:mod:`kvhit.engines.sglang.target`);
a query that target refuses is refused here with the same reason (what any SGLang tree
may be asked, :data:`kvhit.engines.sglang.layout.TREE`, read without importing SGLang).

    >>> from kvhit.engines.pytest_writer import ExportEngine
    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1},
    ...                             {"kind": "sliding_window", "block_size": 1, "window": 3}],
    ...                  "cached": ["1111", "0110"], "max_length": 4})
    >>> text = generate(SavedLookup("x.json", q, ExportEngine.SGLANG))
    >>> "EXPECTED_LENGTH = 3" in text and "import kvhit" not in text
    True

Stateful programs are not exported for SGLang (:class:`BadInput` says so).
"""

from __future__ import annotations

from kvhit.engines.pytest_writer import SavedLookup, SavedProgram, lookup_story, wrapped
from kvhit.engines.sglang.layout import TREE, layout
from kvhit.errors import BadInput, Unsupported
from kvhit.model.spec import Kind, longest_hit, window_before

SGLANG_TEST = '''\
"""SGLang's UnifiedRadixCache.match_prefix on one cache state, against the longest valid hit.

{story}
"""

from __future__ import annotations

from array import array
from importlib.metadata import version

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
{imports}
PAGE_SIZE = {page}  # every group's block size and A: SGLang matches whole pages
FULL_PAGES = {full_pages}  # the tree holds the full KV of tokens 0 … FULL_PAGES * PAGE_SIZE - 1
MAX_LENGTH = {max_length}  # M: the match is asked for the request's first M tokens
# Per group, in the drawing's order: its kind and, for a window, SGLang's exclusive
# sliding_window_size (the tokens before the current one that it reads)
GROUPS = {groups}
{state}SLOTS = (FULL_PAGES + 2) * PAGE_SIZE  # KV slots in the pools
KV = {{"dtype": torch.float32, "head_num": 1, "head_dim": 8, "device": "cpu"}}

# The correct answer, computed by `kvhit export` (kvhit.model.spec.longest_hit, the
# spec, on this state): the longest valid hit L* and the pages each group reuses there.
EXPECTED_LENGTH = {length}
EXPECTED_PAGES = {pages}


def key(tokens):
    """The radix key of the request's first `tokens` tokens (ids 0, 1, ...)."""
    return RadixKey(array("q", range(tokens)))


def new_cache():
    """An empty cache on CPU with the components these groups need."""
{pools}    return UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=requests,
            token_to_kv_pool_allocator=allocator,
            page_size=PAGE_SIZE,
            sliding_window_size={window},
            draft_swa_window={draft_window},
            enable_mamba_extra_buffer={extra_buffer},
            tree_components=({components}),
        )
    )


def full_slots(allocator):
    """The full KV slots of the tree's tokens, as the scheduler takes them for one
    request from scratch."""
{alloc}

def test_match_prefix_is_the_longest_valid_hit():
    cache = new_cache()
    allocator = cache.token_to_kv_pool_allocator
    slots = full_slots(allocator)
    mamba_slots = {{}}  # token count at a page end -> its Mamba state slot
    for page in range(FULL_PAGES):  # inserted page by page, as a prefill inserts it
        start, end = page * PAGE_SIZE, (page + 1) * PAGE_SIZE
        params = InsertParams(key=key(end), value=slots[:end].clone(), prev_prefix_len=start)
{insert}        cache.insert(params)
{evict}
    result = cache.match_prefix(MatchPrefixParams(key=key(MAX_LENGTH)))
    length = result.device_prefix_len

    path = cache.path_device_indices(result.last_device_node)
    position = {{int(slot): p for p, slot in enumerate(slots.tolist())}}
    full = sorted({{position[int(slot)] // PAGE_SIZE for slot in path[:length].tolist()}})
    reused = [pages_reused(kind, window, length, full, cache, slots, mamba_slots) for kind, window in GROUPS]
    assert (length, reused) == (EXPECTED_LENGTH, EXPECTED_PAGES), (
        f"SGLang {{version('sglang')}} reuses {{length}} tokens, pages {{reused}}; the longest "
        f"valid hit is {{EXPECTED_LENGTH}} tokens, pages {{EXPECTED_PAGES}}"
    )


def pages_reused(kind, window, length, full, cache, slots, mamba_slots):
    """The pages a group of `kind` reuses at the hit: the full KV pages on the matched
    path; of those, the ones a window reads whose window KV SGLang still holds; the
    Mamba state at the hit, if SGLang still holds it."""
    if kind == "full":
        return full
    if kind == "sliding_window":
        first = max(0, length - window) // PAGE_SIZE
        to_window = cache.token_to_kv_pool_allocator.full_to_swa_index_mapping
        return [p for p in full if p >= first and int(to_window[slots[p * PAGE_SIZE]]) > 0]
    held = set(cache.all_mamba_values_flatten().tolist())
    state = mamba_slots.get(length)
    return [length // PAGE_SIZE - 1] if state is not None and state in held else []
'''

WINDOW_CACHED_LINE = "WINDOW_CACHED = {row}  # per page: its window KV still held (else freed)\n"
MAMBA_CACHED_LINE = "MAMBA_CACHED = {row}  # per page: the Mamba state at its end held\n"

PLAIN_REQUESTS = """\
    requests = ReqToTokenPool(size=1, max_context_len=SLOTS, device="cpu", enable_memory_saver=False)
"""

MAMBA_REQUESTS = """\
    shape = Mamba2StateShape.create(
        tp_world_size=1, state_size=4, conv_kernel=2, intermediate_size=8, n_groups=1, num_heads=1, head_dim=4
    )
    requests = HybridReqToTokenPool(
        size=1,
        mamba_size=2 * (FULL_PAGES + 1),
        mamba_spec_state_size=1,
        max_context_len=SLOTS,
        device="cpu",
        enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[2]),
        mamba_layer_ids=[2],
        enable_mamba_extra_buffer={extra_buffer},
    )
"""

WINDOW_POOLS = """\
    kv = SWAKVPool(
        size=SLOTS, size_swa=SLOTS, page_size=PAGE_SIZE, swa_attention_layer_ids=[1], full_attention_layer_ids=[0], **KV
    )
    allocator = SWATokenToKVPoolAllocator(
        size=SLOTS,
        size_swa=SLOTS,
        page_size=PAGE_SIZE,
        dtype=KV["dtype"],
        device="cpu",
        kvcache=kv,
        need_sort=False,
        req_to_token_pool={window_requests},
    )
"""

MAMBA_KV = """\
    kv = HybridLinearKVPool(
        size=SLOTS, page_size=PAGE_SIZE, full_attention_layer_ids=[0], mamba_pool=requests.mamba_pool, **KV
    )
"""

FULL_KV = """\
    kv = MHATokenToKVPool(size=SLOTS, page_size=PAGE_SIZE, layer_num=1, enable_memory_saver=False, **KV)
"""

TOKEN_ALLOCATOR = """\
    allocator = TokenToKVPoolAllocator(size=SLOTS, dtype=KV["dtype"], device="cpu", kvcache=kv, need_sort=False)
"""

PAGED_ALLOCATOR = """\
    allocator = PagedTokenToKVPoolAllocator(SLOTS, PAGE_SIZE, KV["dtype"], "cpu", kvcache=kv, need_sort=False)
"""

ALLOC_TOKENS = """\
    return allocator.alloc(FULL_PAGES * PAGE_SIZE)
"""

ALLOC_PAGES = """\
    zero, tokens = torch.tensor([0]), torch.tensor([FULL_PAGES * PAGE_SIZE])
    return allocator.alloc_extend(zero, zero, tokens, tokens, torch.tensor([-1]), FULL_PAGES * PAGE_SIZE)
"""

NO_TOKENS = """\
    return torch.zeros(0, dtype=torch.int64)
"""

WINDOW_INSERT = """\
        if not WINDOW_CACHED[page]:
            allocator.free_swa(slots[start:end])
        params.set_evicted_seqlen(ComponentType.SWA, start if WINDOW_CACHED[page] else end)
"""

MAMBA_INSERT = """\
        state = cache.req_to_token_pool.mamba_allocator.alloc(1)
        mamba_slots[end] = int(state[0])
        params.mamba_value = state
"""

MAMBA_EVICT = """\
    # Evict the Mamba states not cached: the cached ones' nodes locked first, so that
    # evict takes only the others.
    kept = [page for page, held in enumerate(MAMBA_CACHED) if held]
    nodes = [cache.tree_core.match_full_device_prefix(key((page + 1) * PAGE_SIZE))[1] for page in kept]
    locks = [cache.inc_lock_ref(node) for node in nodes]
    if len(kept) < FULL_PAGES:
        cache.evict(EvictParams(num_tokens=0, mamba_num=FULL_PAGES - len(kept)))
    for node, lock in zip(nodes, locks):
        cache.dec_lock_ref(node, lock.to_dec_params())
    held = set(cache.all_mamba_values_flatten().tolist())
    assert held == {mamba_slots[(page + 1) * PAGE_SIZE] for page in kept}, "the state was not built"
"""

IMPORTS = {
    "requests": "from sglang.srt.mem_cache.memory_pool import ReqToTokenPool",
    "mamba": "from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape\n"
    "from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool",
    "window": "from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator\n"
    "from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool",
    "mamba_kv": "from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool",
    "full_kv": "from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool",
    "tokens": "from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator",
    "paged": "from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator",
}
"""The SGLang imports each piece of the generated cache needs."""


def pools(page: int, window: bool, mamba: bool) -> tuple[list[str], str]:
    """The imports and the generated lines that make ``requests`` and ``allocator``:
    SGLang's full + window allocator with a window, else a Mamba or plain KV pool
    under SGLang's token allocator (paged above page size 1); request rows with Mamba
    state slots when there is a Mamba group."""
    extra_buffer = mamba and page > 1
    pieces = ["mamba" if mamba else "requests"]
    code = (MAMBA_REQUESTS if mamba else PLAIN_REQUESTS).format(extra_buffer=extra_buffer)
    if window:
        pieces.append("window")
        code += WINDOW_POOLS.format(window_requests="requests" if mamba else "None")
        return pieces, code
    pieces += ["mamba_kv" if mamba else "full_kv", "tokens" if page == 1 else "paged"]
    code += MAMBA_KV if mamba else FULL_KV
    code += TOKEN_ALLOCATOR if page == 1 else PAGED_ALLOCATOR
    return pieces, code


def lookup_file(saved: SavedLookup) -> str:
    """The pytest file of a saved lookup; :class:`BadInput` if SGLang's tree cannot
    hold the query (the ``sglang`` target's reason)."""
    q = saved.query
    try:
        refused = TREE.refusal(q)
        if refused is not None:
            raise Unsupported(refused)
        lay = layout(q)
    except Unsupported as err:
        raise BadInput(f"{saved.source}: SGLang cannot be asked this: {err}") from None
    window, draft_window = lay.window_sizes
    mamba = lay.mamba_row is not None
    pieces, pool_code = pools(lay.page, window is not None, mamba)
    components = ["ComponentType.FULL"]
    components += ["ComponentType.SWA"] * (window is not None) + ["ComponentType.MAMBA"] * mamba
    state = (WINDOW_CACHED_LINE.format(row=list(lay.window_row)) if lay.windows else "") + (
        MAMBA_CACHED_LINE.format(row=list(lay.mamba_row)) if lay.mamba_row is not None else ""
    )
    best = longest_hit(q)
    groups = [
        (g.kind.value, window_before(g) if g.kind == Kind.SLIDING_WINDOW else None)
        for g in q.groups
    ]
    alloc = NO_TOKENS if not lay.tokens else ALLOC_TOKENS if lay.page == 1 else ALLOC_PAGES
    story = "\n\n".join(
        [
            lookup_story(saved, "SGLang"),
            wrapped(
                f"Exported by `kvhit export {saved.source}`; kvhit's `sglang` target asks SGLang "
                "this query the same way (kvhit.engines.sglang.target)."
            ),
        ]
    )
    return SGLANG_TEST.format(
        story=story,
        imports="".join(IMPORTS[p] + "\n" for p in pieces),
        page=lay.page,
        full_pages=lay.full_blocks,
        max_length=q.max_length,
        groups=groups,
        state=state,
        length=best.length,
        pages=[list(b) for b in best.blocks],
        pools=pool_code,
        window=window,
        draft_window=draft_window,
        extra_buffer=mamba and lay.page > 1,
        components=", ".join(components) + ("," if len(components) == 1 else ""),
        alloc=alloc,
        insert=(WINDOW_INSERT if lay.windows else "") + (MAMBA_INSERT if mamba else ""),
        evict=MAMBA_EVICT if mamba else "",
    )


def generate(saved: SavedLookup | SavedProgram) -> str:
    """The pytest file, in SGLang's terms, of a saved lookup; :class:`BadInput` for a
    stateful program (not exported for SGLang) or a query SGLang cannot be asked."""
    if isinstance(saved, SavedProgram):
        raise BadInput(
            f"{saved.source}: a stateful program is exported for vLLM only; SGLang's "
            "export takes a saved lookup"
        )
    return lookup_file(saved)
