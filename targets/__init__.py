"""Targets: what kvhit checks, and how it calls them.

:mod:`~kvhit.targets.registry` names the built-in targets, :mod:`~kvhit.targets.runner`
calls a stateless target (in process, in a worker process, or a program speaking JSON
lines), :mod:`~kvhit.targets.stateful` drives a stateful engine through its protocol.
"""
