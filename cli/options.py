"""The options ``kvhit fuzz``, ``gate`` and ``replay`` share, handed to a command as one
:class:`~kvhit.targets.target_spec.TargetSpec` and one :class:`RunSettings`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import click

from kvhit.errors import BadInput, TargetError
from kvhit.harness.jobs import default_jobs
from kvhit.harness.random_cases import CHOICES, Choice, QueryShape, choices
from kvhit.targets.registry import default_shape
from kvhit.targets.runner import CALL_TIMEOUT, LOAD_TIMEOUT
from kvhit.targets.target_spec import TargetSpec

REPLAY_OUT = "kvhit-disagreements"
DEFAULT_STEPS = 20
Command = Callable[..., Any]
Decorator = Callable[[Command], Command]


def decorated(func: Command, options: list[Decorator]) -> Command:
    """``func`` with ``options``, the first one on top (as if written above it in order)."""
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def timeout_option(default: float = CALL_TIMEOUT) -> Decorator:
    """``--timeout``: the per-call limit."""
    return click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=default,
        show_default=True,
        help="Per-call limit in seconds.",
    )


def parse_options(given: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``--option NAME=VALUE`` values as (name, value) pairs; BadInput for one without
    ``=`` or a name given twice.

    >>> parse_options(("eagle=drop",))
    (('eagle', 'drop'),)
    >>> parse_options(("eagle",))
    Traceback (most recent call last):
    ...
    kvhit.errors.BadInput: --option takes NAME=VALUE, got 'eagle'
    """
    pairs: dict[str, str] = {}
    for item in given:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise BadInput(f"--option takes NAME=VALUE, got {item!r}")
        if name in pairs:
            raise BadInput(f"--option {name} is given twice")
        pairs[name] = value
    return tuple(pairs.items())


def option_option() -> Decorator:
    """``--option NAME=VALUE``: an option the built-in target declares (named in every
    report), as ``options``."""
    return click.option(
        "--option",
        "options",
        multiple=True,
        metavar="NAME=VALUE",
        help="An option of a built-in target, repeatable (vllm: eagle=default|drop; "
        "vllm-connector: divergent=auto|on|off); the target is then named vllm[eagle=drop].",
    )


@dataclass(frozen=True)
class TargetChoice:
    """``--target`` or ``--target-cmd`` as given (``kvhit replay`` may give neither:
    each file names its own), and how to call the target."""

    name: str | None
    command: str | None
    timeout: float
    isolate: bool
    options: tuple[tuple[str, str], ...]
    load_timeout: float

    @property
    def given(self) -> bool:
        """Whether --target or --target-cmd was given."""
        return self.name is not None or self.command is not None

    def spec(self) -> TargetSpec:
        """The target given; BadInput if the options do not name one target."""
        name, command, options = self.name, self.command, self.options
        try:
            return TargetSpec(name, command, self.timeout, self.isolate, options, self.load_timeout)
        except TargetError as err:
            raise BadInput(str(err)) from None


def target_choice_options(func: Command) -> Command:
    """``--target``, ``--target-cmd``, ``--timeout``, ``--isolate``, ``--option`` and
    ``--load-timeout``, given to ``func`` as one ``target`` (:class:`TargetChoice`),
    which may name none."""

    @functools.wraps(func)
    def wrapper(
        target: str | None,
        target_cmd: str | None,
        timeout: float,
        isolate: bool,
        options: tuple[str, ...],
        load_timeout: float,
        **kwargs: Any,
    ) -> Any:
        pairs = parse_options(options)
        choice = TargetChoice(target, target_cmd, timeout, isolate, pairs, load_timeout)
        return func(target=choice, **kwargs)

    options: list[Decorator] = [
        click.option("--target", help="A built-in target or module:function."),
        click.option("--target-cmd", help="A program speaking JSON lines on stdin/stdout."),
        timeout_option(),
        click.option(
            "--isolate",
            is_flag=True,
            help="Run a --target in a worker process, so a target that crashes the "
            "interpreter (native code, os._exit) is a crash, not the end of the run.",
        ),
        option_option(),
        click.option(
            "--load-timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=LOAD_TIMEOUT,
            show_default=True,
            help="Seconds for loading the target (importing it, starting its worker or "
            "program), apart from every call's --timeout.",
        ),
    ]
    return decorated(wrapper, options)


def target_options(func: Command) -> Command:
    """The options of :func:`target_choice_options`, given to ``func`` as one ``spec``
    (:class:`TargetSpec`); BadInput if they do not name one target."""

    @functools.wraps(func)
    def wrapper(target: TargetChoice, **kwargs: Any) -> Any:
        return func(spec=target.spec(), **kwargs)

    return target_choice_options(wrapper)


@dataclass(frozen=True)
class RunSettings:
    """The options fuzz and gate share, as :func:`run_options` hands them over."""

    spec: TargetSpec
    seconds: float | None
    cases: int | None
    seed: int
    shape: str | None
    out: str
    as_json: bool
    jobs: int
    ray_address: str | None

    def drawn_shape(self) -> QueryShape:
        """--shape, or the shape the built-in target declares
        (:func:`kvhit.targets.registry.default_shape`)."""
        return QueryShape(self.shape if self.shape is not None else default_shape(self.spec.name))


def run_options(func: Command) -> Command:
    """The options fuzz and gate share, given to ``func`` as one :class:`RunSettings`."""
    names = [f.name for f in fields(RunSettings)]

    @functools.wraps(func)
    def packed(**kwargs: Any) -> Any:
        settings = RunSettings(**{name: kwargs.pop(name) for name in names})
        return func(settings, **kwargs)

    options: list[Decorator] = [
        click.option(
            "--seconds",
            type=click.FloatRange(min=0),
            help="Time for random queries (fuzz: 10 unless --cases; gate: 20).",
        ),
        click.option("--cases", type=click.IntRange(min=1), help="At most N random cases."),
        click.option(
            "--seed",
            type=int,
            default=0,
            show_default=True,
            help="Same seed and options, same cases.",
        ),
        click.option("--out", default=REPLAY_OUT, show_default=True, help="Replay files go here."),
        click.option(
            "--shape",
            type=click.Choice([str(s) for s in QueryShape]),
            help="What is drawn: queries (or, with --stateful, engine configurations) of "
            "every kind and mix (any), or only what SGLang's one radix tree holds "
            "(sglang). Default: sglang for --target sglang, else any.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
        click.option(
            "--jobs",
            type=click.IntRange(min=1),
            default=default_jobs,
            show_default="the cores",
            help="Split the cases over N processes (same seed and N, same cases).",
        ),
        click.option(
            "--ray",
            "ray_address",
            metavar="ADDRESS",
            help="Run the --jobs on the Ray cluster at ADDRESS ('local': start one here).",
        ),
    ]
    return target_options(decorated(packed, options))


def stateful_options(func: Command) -> Command:
    """``--stateful``, ``--steps`` and ``--prompt-tokens``."""
    func = click.option(
        "--prompt-tokens",
        type=click.IntRange(min=1),
        metavar="N",
        help="With --stateful: the most tokens per prompt (default: gate 16, fuzz 2 x "
        "--max-blocks); longer prompts reach bugs deep in a prefix, at a cost in speed.",
    )(func)
    func = click.option(
        "--steps",
        type=click.IntRange(min=1),
        help=f"With --stateful: the most operations per program (default {DEFAULT_STEPS}).",
    )(func)
    return click.option(
        "--stateful",
        is_flag=True,
        help="Drive a stateful engine (module:factory, or impl, vllm, sglang) with programs of "
        "requests and check every lookup against a content ledger; see docs/stateful.md.",
    )(func)


def refuse_with_stateful(**given: Any) -> None:
    """BadInput if an option that a campaign of programs does not take was given."""
    for option, value in given.items():
        if value:
            raise BadInput(f"--{option.replace('_', '-')} is not available with --stateful")


def refuse_without_stateful(stateful: bool, **given: Any) -> None:
    """BadInput if an option that only a campaign of programs takes was given without
    ``--stateful`` (it would change nothing)."""
    for option, value in given.items():
        if value is not None and not stateful:
            raise BadInput(f"--{option.replace('_', '-')} needs --stateful")


def check_kinds(kinds: str | None) -> tuple[Choice, ...]:
    """``--kinds full,mamba,eagle`` as choices; BadInput naming an unknown kind."""
    if kinds is None:
        return CHOICES
    try:
        picked = choices(k.strip() for k in kinds.split(",") if k.strip())
    except ValueError as err:
        raise BadInput(f"--kinds: {err}") from None
    if not picked:
        raise BadInput(f"--kinds: no kind given; choose from {', '.join(CHOICES)}")
    return picked
