"""A stateful engine factory of Python as a ``--target-cmd`` program:
``python tests/stateful_cmd.py module:factory`` reads one stateful message per line and
answers each with one line (the typed answer's protocol form), as a program written in
any language would."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kvhit.contract import EngineConfig
from kvhit.errors import Unsupported
from kvhit.importing import import_attr
from kvhit.targets.stateful import Create, EngineHost, Look, parse_config, parse_op


def answer(host: EngineHost, config: EngineConfig | None, message: dict[str, Any]) -> Any:
    """The answer line's value for one message."""
    if message["op"] == "snapshot":
        assert config is not None
        return host(Look(tuple(message["tokens"]), config)).to_json()
    value = host(parse_op(message, 0))
    return None if value is None else value.to_json()


def main(factory: str) -> None:
    """Serve the engine ``factory`` makes until stdin ends."""
    sys.path.insert(0, str(Path(__file__).parent))
    host, config = EngineHost(import_attr(factory)), None
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if message["op"] == "create":
                config = parse_config({k: v for k, v in message.items() if k != "op"})
                value = host(Create(config))
            else:
                value = answer(host, config, message)
        except Unsupported as err:
            value = {"unsupported": str(err)}
        print(json.dumps(value), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
