"""A JSON-lines target program for the ``--target-cmd`` tests.

python cmd_target.py good      the reference answer for every query
python cmd_target.py hang      hangs on one-group queries with M = 3, answers the others
python cmd_target.py garbage   prints a line that is not JSON for mamba queries
python cmd_target.py refuse    {"unsupported": ...} for eagle queries
python cmd_target.py dies      says why on stderr and exits 3 on queries with a mamba group
"""

from __future__ import annotations

import json
import sys
import time

from kvhit.targets.registry import model_target


def answer_line(mode: str, query: dict) -> str:
    """The line this mode prints for ``query``."""
    if mode == "hang" and query["max_length"] == 3 and len(query["groups"]) == 1:
        time.sleep(3600)
    if mode == "garbage" and any(g["kind"] == "mamba" for g in query["groups"]):
        return "<<not json>>"
    if mode == "refuse" and any(g["eagle"] for g in query["groups"]):
        return json.dumps({"unsupported": "no eagle groups here"})
    if mode == "dies" and any(g["kind"] == "mamba" for g in query["groups"]):
        print("lookup.c:42: no state for block -1", file=sys.stderr, flush=True)
        sys.exit(3)
    return json.dumps(model_target(query))


def main() -> None:
    mode = sys.argv[1]
    for line in sys.stdin:
        print(answer_line(mode, json.loads(line)), flush=True)


if __name__ == "__main__":
    main()
