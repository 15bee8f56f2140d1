"""kvhit: a verified reference for hybrid-attention prefix-cache hits.

Subpackages: :mod:`kvhit.model` (the spec and reference algorithms),
:mod:`kvhit.proofs` (SMT proofs over the model's own code), :mod:`kvhit.impl` (a
torch-backed hybrid prefix cache), :mod:`kvhit.harness` (differential fuzzing and
gating of any target). :mod:`kvhit.targets.registry` names the built-in targets.
"""

__version__ = "0.1.0"
