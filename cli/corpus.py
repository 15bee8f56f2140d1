"""``python -m kvhit.cli.corpus``: regenerate the gate's solver corpus.

The solver (:mod:`kvhit.proofs.corpus_states`) searches every pair of the gate's
small groups (:func:`kvhit.harness.exhaustive.gate_groups`) for cache states where a
known-wrong algorithm differs from L*; :func:`kvhit.harness.corpus.write` keeps them
where the gate reads them. It takes about 25 s.
"""

from __future__ import annotations

from kvhit.harness import corpus
from kvhit.harness.exhaustive import gate_groups
from kvhit.proofs.corpus_states import generate


def regenerate() -> int:
    """Search and keep the corpus; how many entries."""
    entries = generate(gate_groups())
    corpus.write(entries)
    return len(entries)


if __name__ == "__main__":
    print(regenerate(), "entries")
