"""Which target to check and how to call it: one value for ``--target`` or
``--target-cmd``, ``--option``, ``--timeout``, ``--isolate`` and ``--load-timeout``,
and the one place that opens it.

    >>> spec = TargetSpec(command="./my engine --fast")
    >>> spec.label, spec.replay_flag
    ('cmd:./my engine --fast', "--target-cmd './my engine --fast'")
    >>> spec = TargetSpec("vllm", options=(("eagle", "drop"),))
    >>> spec.label, spec.replay_flag
    ('vllm[eagle=drop]', '--target vllm --option eagle=drop')
    >>> TargetSpec("model").open()({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...         "cached": [[True]], "max_length": 1, "num_tokens": 2, "alignment": 1})
    Reply(status='answer', value={'length': 1, 'blocks': [[0]]}, detail='')
    >>> TargetSpec("model", "./engine")
    Traceback (most recent call last):
    ...
    kvhit.errors.TargetError: give exactly one of --target and --target-cmd
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kvhit.errors import TargetError
from kvhit.targets.registry import Mode, resolved_options
from kvhit.targets.runner import (
    CALL_TIMEOUT,
    LOAD_TIMEOUT,
    CallableRunner,
    CommandRunner,
    IsolatedRunner,
    Runner,
    load_within,
)
from kvhit.targets.stateful import EngineHost
from kvhit.targets.target_record import TargetRecord


@dataclass(frozen=True)
class TargetSpec:
    """A target: ``name`` (a built-in, or ``module:function`` / ``module:factory``) or
    ``command`` (a program speaking JSON lines), exactly one of them; the per-call
    ``timeout``; with ``isolate``, a named target runs in a worker process; ``options``
    (name, value) pairs a built-in declares (:class:`kvhit.contract.Option`), sorted;
    loading the target (importing it, starting its worker or its program) has
    ``load_timeout`` seconds, not counted in any call.

    Raises :class:`~kvhit.errors.TargetError` when the combination is not allowed.
    """

    name: str | None = None
    command: str | None = None
    timeout: float = CALL_TIMEOUT
    isolate: bool = False
    options: tuple[tuple[str, str], ...] = ()
    load_timeout: float = LOAD_TIMEOUT

    def __post_init__(self) -> None:
        if (self.name is None) == (self.command is None):
            raise TargetError("give exactly one of --target and --target-cmd")
        if self.isolate and self.command is not None:
            raise TargetError(
                "--isolate is for --target; a --target-cmd program has its own process"
            )
        if self.options and self.name is None:
            raise TargetError("--option is for a built-in --target")
        object.__setattr__(self, "options", tuple(sorted(self.options)))
        if self.name is not None:
            resolved_options(self.name, dict(self.options))

    def chosen(self) -> dict[str, str]:
        """The options given, by name."""
        return dict(self.options)

    @property
    def record(self) -> TargetRecord:
        """What a saved file records of this target: its name and options, or its command."""
        return TargetRecord(self.name, self.options, self.command)

    @property
    def label(self) -> str:
        """How reports name the target: its name, and the options given.

        >>> TargetSpec("vllm-connector", options=(("divergent", "on"),)).label
        'vllm-connector[divergent=on]'
        """
        return self.record.label

    @property
    def replay_flag(self) -> str:
        """The command-line options that name the same target again, for a replay hint."""
        if self.name is not None:
            given = "".join(f" --option {shlex.quote(f'{k}={v}')}" for k, v in self.options)
            return f"--target {shlex.quote(self.name)}{given}"
        return f"--target-cmd {shlex.quote(self.command or '')}"

    def open(self, mode: Mode = Mode.LOOKUP) -> Runner:
        """A runner for this target in ``mode``: of protocol queries (a lookup), or of
        the stateful protocol's messages (an engine made by a factory, or a program
        reading one message per line and answering one line). The options go to the
        built-in's factories (in a worker too). Raises :class:`~kvhit.errors.TargetError`
        when the target cannot be loaded.
        """
        if self.command is not None:
            return CommandRunner(self.command, self.timeout, self.load_timeout)
        assert self.name is not None
        if self.isolate:
            if mode == Mode.STATEFUL:
                raise TargetError("--isolate is for lookups, not for stateful engines")
            return IsolatedRunner(self.name, self.timeout, self.load_timeout, self.chosen())
        loaded, took = load_within(self.name, mode, self.load_timeout, self.chosen())
        func = EngineHost(loaded) if mode == Mode.STATEFUL else loaded
        return CallableRunner(func, self.timeout, took)
