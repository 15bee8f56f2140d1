"""Targets: what kvhit checks, and how it calls them.

:mod:`~kvhit.targets.registry` is the one table of built-in targets (each one's lookup
and stateful engine), :mod:`~kvhit.targets.target_spec` the one value naming a target
(``--target`` or ``--target-cmd``, its timeout) and the one place that opens it,
:mod:`~kvhit.targets.runner` calls a target (in process, in a worker process, or a
program speaking JSON lines), :mod:`~kvhit.targets.wire` decodes a lookup's answer and
:mod:`~kvhit.targets.stateful` is the protocol of stateful engines.
"""
