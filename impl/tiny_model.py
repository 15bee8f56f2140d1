"""A tiny hybrid model whose prefill reads earlier tokens only through the paged cache.

One layer per KV cache group, of that group's kind: causal full attention, sliding
window attention (the token at p sees keys p - t … p; t = w - 1 for an inclusive window), chunked local attention
(keys from the start of p's chunk to p), or a linear recurrence standing in for
Mamba (h_p = a·h_{p-1} + x_p·W_in, out = h_p·W_out; a block stores one state: at
its end, or, for a block the request's keys stop inside, at its last keyed unit,
as a partially filled block). Random weights, float64, seeded.

:meth:`TinyHybrid.prefill` computes tokens ``start`` … T-1. What it needs of tokens
before ``start`` it takes from :class:`PagedStore`, and only the blocks its own
masks (or, for the recurrence, the state it continues from) ask for: it records
those gathers. Everything else of the past is NaN, and so is a block that is not
cached (the null block), so any read the spec did not allow shows up as NaN.

    >>> from kvhit.model.spec import Group, window_before
    >>> model = TinyHybrid([Group("sliding_window", 2, window=3)], seed=0)
    >>> store = PagedStore(model.groups, num_blocks=4, dim=model.dim)
    >>> first = model.prefill([1, 2, 3, 4, 5], 0, [[1, 2, 3]], store)
    >>> store.write([[1, 2, 3]], first)
    >>> again = model.prefill([1, 2, 3, 4, 5], 4, [[0, 2]], store)
    >>> again.reads, bool((again.logits - first.logits[4:]).abs().max() < 1e-12)
    ([[1]], True)

A prefill may start inside a block (a hit of a multiple of the hash unit): attention
reads the first tokens of that block from the cache, the recurrence the state at
exactly ``start``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvhit.impl.hashing import key_offset, keyed_units
from kvhit.model.spec import Group, Kind, window_before

Tables = Sequence[Sequence[int]]


FIRST_KEY: dict[Kind, Callable[[Group, torch.Tensor], torch.Tensor] | None] = {
    Kind.FULL: lambda g, q: torch.zeros_like(q),
    Kind.SLIDING_WINDOW: lambda g, q: q - window_before(g),
    Kind.CHUNKED_LOCAL: lambda g, q: q // g.chunk * g.chunk,
    Kind.MAMBA: None,
}
"""Per kind, the first key a query at position q sees; None for a recurrent layer,
which keeps a state instead of keys."""


def is_recurrent(g: Group) -> bool:
    """Whether group g's layer is a recurrence (a state per block boundary, no keys)."""
    return FIRST_KEY[g.kind] is None


def attends(g: Group, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """The attention mask of a layer of group g's kind: which keys each query sees.

    >>> from kvhit.model.spec import Group
    >>> attends(Group("chunked_local", 1, chunk=2), torch.tensor([[3]]), torch.arange(4))
    tensor([[False, False,  True,  True]])
    """
    first = FIRST_KEY[g.kind]
    assert first is not None, f"a {g.kind} layer attends to no keys"
    return (key_pos <= query_pos) & (key_pos >= first(g, query_pos))


class PagedStore:
    """KV (attention groups) and boundary states (mamba groups) in torch tensors,
    indexed by physical block id; everything starts as NaN."""

    def __init__(self, groups: Sequence[Group], num_blocks: int, dim: int):
        self.groups = tuple(groups)
        self.data = [
            torch.full(
                (num_blocks, dim) if is_recurrent(g) else (num_blocks, g.block_size, 2, dim),
                math.nan,
                dtype=torch.float64,
            )
            for g in groups
        ]

    def write(self, tables: Tables, result: Prefill) -> None:
        """Store the KV and states a prefill computed into the request's blocks: KV
        token by token from ``result.start`` on (a block's earlier tokens stay as they
        are), states into their blocks."""
        for g, data, table, new in zip(self.groups, self.data, tables, result.new):
            if isinstance(new, dict):
                for j, state in new.items():
                    data[table[j]] = state
                continue
            positions = torch.arange(result.start, result.start + new.shape[0])
            blocks = torch.tensor(table, dtype=torch.int64)[positions // g.block_size]
            data[blocks, positions % g.block_size] = new

    def copy(self, group: int, source: int, destination: int) -> None:
        """Copy block ``source``'s data of group ``group`` into block ``destination``."""
        self.data[group][destination] = self.data[group][source]


@dataclass
class Prefill:
    """What a prefill from ``start`` produced: logits for tokens start … T-1, the block
    indices each group read from the cache, and per group what it computed: an
    attention layer's KV of tokens start … T-1, a recurrence's states (block index ->
    the state the block stores)."""

    start: int
    logits: torch.Tensor
    reads: list[list[int]]
    new: list[torch.Tensor | dict[int, torch.Tensor]]


class TinyHybrid:
    """The model: an embedding, one residual layer per group, a linear head."""

    def __init__(
        self,
        groups: Sequence[Group],
        seed: int,
        dim: int = 8,
        vocab: int = 16,
        units: Sequence[int] | None = None,
    ):
        self.groups = tuple(groups)
        self.units = tuple(units) if units is not None else tuple(g.block_size for g in groups)
        """Each group's hash unit: where a partially filled block's state is stored."""
        self.dim = dim
        gen = torch.Generator().manual_seed(seed)

        def weights(*shape: int, scale: float = 1 / math.sqrt(dim)) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

        self.embed = weights(vocab, dim, scale=1.0)
        self.layers = [weights(4, dim, dim) for _ in self.groups]
        self.decay = [
            0.5 + 0.5 * torch.rand(dim, generator=gen, dtype=torch.float64) for _ in self.groups
        ]
        self.head = weights(dim, vocab)

    def prefill(
        self, tokens: Sequence[int], start: int, tables: Tables, store: PagedStore
    ) -> Prefill:
        """Compute tokens ``start`` … T-1, reading tokens before ``start`` from the cache.

        ``start`` is a multiple of every group's unit.
        """
        x = self.embed[torch.tensor(tokens[start:], dtype=torch.int64)]
        reads, new = [], []
        for i, g in enumerate(self.groups):
            layer = self.recurrence if is_recurrent(g) else self.attention
            out, read, blocks = layer(i, x, start, len(tokens), tables[i] if start else [], store)
            x = x + out
            reads.append(read)
            new.append(blocks)
        return Prefill(start, x @ self.head, reads, new)

    def attention(
        self,
        i: int,
        x: torch.Tensor,
        start: int,
        total: int,
        table: Sequence[int],
        store: PagedStore,
    ) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """One attention layer over the new tokens; past KV gathered block by block
        (the block ``start`` falls inside, if any, included)."""
        g, (wq, wk, wv, wo) = self.groups[i], self.layers[i]
        b = g.block_size
        mask = attends(g, torch.arange(start, total)[:, None], torch.arange(total)[None, :])
        needed = mask[:, :start].any(0).nonzero().flatten()
        reads = torch.unique(needed // b)
        past = torch.full((-(-start // b), b, 2, self.dim), math.nan, dtype=torch.float64)
        past[reads] = store.data[i][torch.tensor(table, dtype=torch.int64)[reads]]
        past = past.reshape(-1, 2, self.dim)[:start]
        kv = torch.cat([past, torch.stack([x @ wk, x @ wv], 1)])
        scores = torch.where(mask, (x @ wq) @ kv[:, 0].T / math.sqrt(self.dim), -math.inf)
        weights = torch.softmax(scores, -1)
        # 0 * NaN is NaN: zero the keys the mask hides instead of multiplying by 0.
        values = torch.where(mask[..., None], kv[None, :, 1], 0.0)
        out = (weights[..., None] * values).sum(1) @ wo
        return out, reads.tolist(), kv[start:]

    def recurrence(
        self,
        i: int,
        x: torch.Tensor,
        start: int,
        total: int,
        table: Sequence[int],
        store: PagedStore,
    ) -> tuple[torch.Tensor, list[int], dict[int, torch.Tensor]]:
        """The linear recurrence, continuing from the state stored at ``start`` (in
        the block of token start - 1). Each block stores its state at its end, or at
        the end of the request's last keyed unit if that falls inside it."""
        g, (w_in, w_out, _, _), decay = self.groups[i], self.layers[i], self.decay[i]
        b, unit = g.block_size, self.units[i]
        keyed_end = keyed_units(unit, key_offset(g), total) * unit
        reads = [(start - 1) // b] if start else []
        h = store.data[i][table[reads[0]]] if start else torch.zeros(self.dim, dtype=torch.float64)
        outs, states = [], {}
        for p in range(start, total):
            h = decay * h + x[p - start] @ w_in
            outs.append(h @ w_out)
            if (p + 1) % b == 0 and p < keyed_end or p + 1 == keyed_end:
                states[p // b] = h
        return torch.stack(outs), reads, states
