"""The package's import graph goes one way: errors and drawing at the bottom,
subsystems in the middle, commands on top; and the gate path loads no solver."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each module's layer; a module may import only modules of its own layer or below.
LAYERS = [
    ("kvhit", 0),  # the package itself: its version, nothing else
    ("kvhit.model", 0),
    ("kvhit.errors", 1),
    ("kvhit.importing", 1),
    ("kvhit.draw", 1),
    ("kvhit.inputs", 1),
    ("kvhit.check", 1),
    ("kvhit.reference", 1),
    ("kvhit.targets", 1),
    ("kvhit.impl", 2),
    ("kvhit.proofs", 2),
    ("kvhit.harness", 2),
    ("kvhit.adapters", 2),
    ("kvhit.examples", 2),
    ("kvhit.proofs.command", 3),
    ("kvhit.harness.command", 3),
    ("kvhit.verify", 3),
    ("kvhit.cli", 4),
]


def layer(module: str) -> int:
    """The layer of the longest prefix in LAYERS that names ``module``'s package."""
    matches = [(len(p), n) for p, n in LAYERS if module == p or module.startswith(p + ".")]
    assert matches, f"{module} has no layer; add it to LAYERS"
    return max(matches)[1]


def modules() -> dict[str, Path]:
    """Every module of the distribution, by its kvhit.* name (from pyproject's package-dir)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = {}
    for package, folder in config["tool"]["setuptools"]["package-dir"].items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The kvhit modules ``path`` imports anywhere in its code (top level or inside a
    function); ``from kvhit.x import y`` counts as kvhit.x.y when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def test_every_import_goes_down_or_sideways() -> None:
    wrong = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, deps in graph().items()
        for b in deps
        if layer(b) > layer(a)
    ]
    assert not wrong, "\n".join(wrong)


def test_import_graph_has_no_cycle() -> None:
    try:
        list(TopologicalSorter(graph()).static_order())
    except CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_the_gate_path_does_not_load_z3() -> None:
    code = (
        "import sys, click\n"
        "from kvhit.cli import main\n"
        "gate = main.get_command(click.Context(main), 'gate')\n"
        "from kvhit.harness import gate as plan\n"
        "from kvhit.harness.engine import Engine\n"
        "from kvhit.harness.runner import open_target\n"
        "from dataclasses import replace\n"
        "engine = Engine(open_target('model'), 'model')\n"
        "for phase in plan.gate_phases(seconds=1):\n"
        "    engine.run(replace(phase, limit=50))\n"
        "assert gate is not None and engine.cases == 150, engine.cases\n"
        "print(sorted(m for m in sys.modules if m == 'z3' or m.startswith(('z3.', 'cvc5'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
