"""kvhit: a verified reference for hybrid-attention prefix-cache hits.

This package's own modules are the bottom every layer uses (errors, names imported
later, drawing, query files, the reference answers). Subpackages:
:mod:`kvhit.model` (the spec and reference algorithms), :mod:`kvhit.proofs` (SMT
proofs over the model's own code), :mod:`kvhit.impl` (a torch-backed hybrid prefix
cache), :mod:`kvhit.targets` (what is checked and how it is called),
:mod:`kvhit.harness` (checking any target against the model), :mod:`kvhit.engines`
(vLLM and SGLang as targets), :mod:`kvhit.cli` (the command line). docs/design.md §6
draws the layers.
"""

__version__ = "0.1.0"
