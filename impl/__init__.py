"""A torch-backed hybrid prefix cache, checked against the model (docs/design.md §4).

:mod:`~kvhit.impl.coordinator` has the vectorized lookup, :mod:`~kvhit.impl.engine`
serves requests through it with the tiny model of :mod:`~kvhit.impl.tiny_model`, and
:mod:`~kvhit.impl.target` is the built-in target ``impl``.
"""
