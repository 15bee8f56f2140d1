"""Which target to check and how to call it: one value for ``--target`` or
``--target-cmd``, ``--timeout``, ``--isolate``, ``--vllm-eagle`` and
``--load-timeout``, and the one place that opens it.

    >>> spec = TargetSpec(command="./my engine --fast")
    >>> spec.label, spec.replay_flag
    ('cmd:./my engine --fast', "--target-cmd './my engine --fast'")
    >>> TargetSpec("model").open()({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...         "cached": [[True]], "max_length": 1, "num_tokens": 2, "alignment": 1})
    Reply(status='answer', value={'length': 1, 'blocks': [[0]]}, detail='')
    >>> TargetSpec("model", "./engine")
    Traceback (most recent call last):
    ...
    kvhit.errors.TargetError: give exactly one of --target and --target-cmd
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from kvhit.engines.vllm.release import EAGLE_ENV, VLLM_TARGETS, EaglePath, target_label
from kvhit.errors import TargetError
from kvhit.targets.registry import Mode
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

COMMAND_LABEL = "cmd:"
"""How a report's target label starts for a --target-cmd program (:attr:`TargetSpec.label`)."""


@dataclass(frozen=True)
class TargetSpec:
    """A target: ``name`` (a built-in, or ``module:function`` / ``module:factory``) or
    ``command`` (a program speaking JSON lines), exactly one of them; the per-call
    ``timeout``; with ``isolate``, a named target runs in a worker process; a vllm
    target runs its drafters on ``vllm_eagle`` (:class:`EaglePath`); loading the target
    (importing it, starting its worker or its program) has ``load_timeout`` seconds,
    not counted in any call.

    Raises :class:`~kvhit.errors.TargetError` when the combination is not allowed.
    """

    name: str | None = None
    command: str | None = None
    timeout: float = CALL_TIMEOUT
    isolate: bool = False
    vllm_eagle: EaglePath = EaglePath.DEFAULT
    load_timeout: float = LOAD_TIMEOUT

    def __post_init__(self) -> None:
        if (self.name is None) == (self.command is None):
            raise TargetError("give exactly one of --target and --target-cmd")
        if self.isolate and self.command is not None:
            raise TargetError(
                "--isolate is for --target; a --target-cmd program has its own process"
            )
        if self.vllm_eagle != EaglePath.DEFAULT and self.name not in VLLM_TARGETS:
            raise TargetError(f"--vllm-eagle is for --target {' or '.join(VLLM_TARGETS)}")

    @property
    def label(self) -> str:
        """How reports name the target."""
        if self.name is None:
            return f"{COMMAND_LABEL}{self.command}"
        return target_label(self.name, self.vllm_eagle)

    @property
    def replay_flag(self) -> str:
        """The option that names the same target again, for a replay hint."""
        if self.name is not None:
            eagle = (
                f" --vllm-eagle {self.vllm_eagle}" if self.vllm_eagle != EaglePath.DEFAULT else ""
            )
            return f"--target {shlex.quote(self.name)}{eagle}"
        return f"--target-cmd {shlex.quote(self.command or '')}"

    def open(self, mode: Mode = Mode.LOOKUP) -> Runner:
        """A runner for this target in ``mode``: of protocol queries (a lookup), or of
        the stateful protocol's messages (an engine made by a factory, or a program
        reading one message per line and answering one line).

        A vllm target's eagle path goes to it (and to its workers) through the
        environment (:data:`EAGLE_ENV`). Raises :class:`~kvhit.errors.TargetError` when
        the target cannot be loaded.
        """
        if self.name in VLLM_TARGETS:
            if mode == Mode.STATEFUL and self.vllm_eagle != EaglePath.DEFAULT:
                raise TargetError("--vllm-eagle drop is for lookups, not for stateful engines")
            os.environ[EAGLE_ENV] = self.vllm_eagle
        if self.command is not None:
            return CommandRunner(self.command, self.timeout, self.load_timeout)
        assert self.name is not None
        if self.isolate:
            if mode == Mode.STATEFUL:
                raise TargetError("--isolate is for lookups, not for stateful engines")
            return IsolatedRunner(self.name, self.timeout, self.load_timeout)
        loaded, took = load_within(self.name, mode, self.load_timeout)
        func = EngineHost(loaded) if mode == Mode.STATEFUL else loaded
        return CallableRunner(func, self.timeout, took)
