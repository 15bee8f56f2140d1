"""The target a saved file names: a built-in or ``module:attr`` with the options it was
given, or a ``--target-cmd`` program, as structured data (docs/protocol.md, "Saved
files"). ``kvhit replay`` runs a file on the target it records without parsing any
display label; :attr:`TargetRecord.label` is that label, for people.

    >>> record = TargetRecord("vllm", (("eagle", "drop"),))
    >>> record.to_json(), record.label
    ({'name': 'vllm', 'options': {'eagle': 'drop'}}, 'vllm[eagle=drop]')
    >>> TargetRecord.from_json({"command": "./engine --fast"}).label
    'cmd:./engine --fast'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvhit.model.protocol import QueryError

COMMAND_PREFIX = "cmd:"
"""How the label of a ``--target-cmd`` program starts."""


@dataclass(frozen=True)
class TargetRecord:
    """A target as a file records it: ``name`` (with its ``options``, (name, value)
    pairs kept sorted) or ``command``, exactly one of the two."""

    name: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    command: str | None = None

    def __post_init__(self) -> None:
        if (self.name is None) == (self.command is None):
            raise ValueError("a target record names exactly one of name and command")
        object.__setattr__(self, "options", tuple(sorted(self.options)))

    @property
    def label(self) -> str:
        """How reports name the target: ``vllm[eagle=drop]``, ``cmd:./engine``."""
        if self.name is None:
            return f"{COMMAND_PREFIX}{self.command}"
        given = ",".join(f"{key}={value}" for key, value in self.options)
        return f"{self.name}[{given}]" if given else self.name

    def to_json(self) -> dict[str, Any]:
        """The record's JSON: ``{"name": ..., "options": {...}}`` (options only when
        given) or ``{"command": ...}``."""
        if self.command is not None:
            return {"command": self.command}
        out: dict[str, Any] = {"name": self.name}
        if self.options:
            out["options"] = dict(self.options)
        return out

    @staticmethod
    def from_json(obj: Any) -> TargetRecord:
        """The record :meth:`to_json` wrote; :class:`QueryError` naming the field."""
        if not isinstance(obj, dict) or set(obj) - {"name", "options", "command"}:
            raise QueryError(
                "target", 'must be {"name": ..., "options": {...}} or {"command": ...}'
            )
        name, command, options = obj.get("name"), obj.get("command"), obj.get("options", {})
        if (name is None) == (command is None):
            raise QueryError("target", "must name exactly one of name and command")
        if not isinstance(name if command is None else command, str):
            raise QueryError("target", "name and command must be strings")
        if not isinstance(options, dict) or command is not None and options:
            raise QueryError("target.options", "must be an object of a named target's options")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
            raise QueryError("target.options", "must map option names to string values")
        return TargetRecord(name, tuple(options.items()), command)

    @staticmethod
    def from_label(label: str) -> TargetRecord:
        """The target an old file's display label names (files of format 1 recorded
        only :attr:`label`); a label that is no built-in with options is a name.

        >>> TargetRecord.from_label("vllm[eagle=drop]")
        TargetRecord(name='vllm', options=(('eagle', 'drop'),), command=None)
        >>> TargetRecord.from_label("cmd:./engine --fast").command
        './engine --fast'
        """
        if label.startswith(COMMAND_PREFIX):
            return TargetRecord(command=label.removeprefix(COMMAND_PREFIX))
        name, bracket, given = label.partition("[")
        if not bracket or not given.endswith("]") or ":" in name:
            return TargetRecord(label)
        pairs = (item.partition("=") for item in given[:-1].split(","))
        return TargetRecord(name, tuple((key, value) for key, _, value in pairs))
