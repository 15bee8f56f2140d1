"""The package's import graph goes one way (docs/design.md §6.2): the model, then
kvhit's bottom (errors, drawing, query files), then the subsystems, the command line
on top and the only importer of click and rich; and the gate path loads no solver."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest
from kvhit_modules import ROOT, modules

# Each package's layer; a module may import only modules of its own layer or below.
# The bottom (kvhit's own modules: errors, names to import, drawing, query files, the
# reference answers) imports the model alone; the command line is the only top.
LAYERS = [
    ("kvhit", 1),
    ("kvhit.model", 0),
    ("kvhit.examples", 2),
    ("kvhit.impl", 2),
    ("kvhit.engines", 2),
    ("kvhit.targets", 2),
    ("kvhit.proofs", 3),
    ("kvhit.harness", 3),
    ("kvhit.cli", 4),
]
UI = ("click", "rich")
SIDEWAYS_FORBIDDEN = [
    ("kvhit.targets", "kvhit.engines"),
    ("kvhit.impl", "kvhit.targets"),
]
"""Packages of one layer that must not import each other: targets name engines only as
``module:attr`` strings, and impl is a target through the contract
(:mod:`kvhit.contract`), not through the checker's own modules."""


def layer(module: str) -> int:
    """The layer of the longest prefix in LAYERS that names ``module``'s package."""
    matches = [(len(p), n) for p, n in LAYERS if module == p or module.startswith(p + ".")]
    assert matches, f"{module} has no layer; add it to LAYERS"
    return max(matches)[1]


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


def lazy_references(path: Path, known: set[str]) -> set[str]:
    """The kvhit modules ``path`` names as ``"kvhit.x:attr"`` strings, imported when
    used (the registries of commands, targets and verify sections)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            module, colon, attr = node.value.partition(":")
            if colon and attr.isidentifier():
                found.add(module)
    return {m for m in found if m in known}


def third_party(path: Path) -> set[str]:
    """The top-level names of every package ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def graph(lazy: bool = False) -> dict[str, set[str]]:
    """Each module's kvhit imports (and, with ``lazy``, the modules it names to load)."""
    found = modules()
    known = set(found)
    return {
        name: (imports(path, known) | (lazy_references(path, known) if lazy else set())) - {name}
        for name, path in found.items()
    }


def test_every_import_goes_down_or_sideways() -> None:
    wrong = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, deps in graph().items()
        for b in deps
        if layer(b) > layer(a)
    ]
    assert not wrong, "\n".join(wrong)


def in_package(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or inside it."""
    return module == package or module.startswith(package + ".")


def test_targets_and_impl_meet_engines_only_through_the_contract() -> None:
    """No import from targets into engines (the registry names them as strings), nor
    from impl into targets."""
    wrong = [
        f"{a} imports {b}"
        for a, deps in graph().items()
        for b in deps
        for low, high in SIDEWAYS_FORBIDDEN
        if in_package(a, low) and in_package(b, high)
    ]
    assert not wrong, "\n".join(wrong)


def test_only_the_command_line_imports_click_and_rich() -> None:
    """Subsystems return data and raise kvhit's errors; printing is the command line's."""
    wrong = [
        f"{name} imports {', '.join(sorted(third_party(path) & set(UI)))}"
        for name, path in modules().items()
        if layer(name) < 4 and third_party(path) & set(UI)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("lazy", [False, True], ids=["imports", "imports-and-lazy-names"])
def test_import_graph_has_no_cycle(lazy: bool) -> None:
    """No cycle of imports, nor of imports and the modules registries name to load
    later (those may point up: the command line names its commands)."""
    edges = graph(lazy)
    assert sum(map(len, edges.values())) > 100
    try:
        list(TopologicalSorter(edges).static_order())
    except CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_kvhit_gate_does_not_load_z3(tmp_path: Path) -> None:
    """A whole ``kvhit gate`` run (every phase) imports neither z3 nor cvc5; the
    interpreter's own import log says what it imported."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kvhit.cli", "gate", "--target", "model"]
        + ["--seconds", "0.2", "--jobs", "1", "--json", "--out", "found"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert set(json.loads(run.stdout)["phases"]) == {"exhaustive", "corpus", "random"}
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if "|" in line}
    assert "kvhit.harness.corpus" in imported and "torch" in imported
    assert not {m for m in imported if m.split(".")[0] in ("z3", "cvc5")}


def top_level_names(path: Path) -> set[str]:
    """The classes, type aliases and constants ``path`` defines at its top level (every
    capitalized name)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            found.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        found |= {t.id for t in targets if isinstance(t, ast.Name) and t.id[0].isupper()}
    return found


def test_no_two_modules_define_one_name() -> None:
    """A class, type alias or constant has one meaning in the package: two modules
    never define the same name. The theorem modules share two names by convention: ``THEOREMS``
    (what the registry reads from each) and ``CONFIGS`` (the block sizes and alignments
    each one's goals are built at)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        for defined in top_level_names(path) - {"THEOREMS", "CONFIGS"}:
            where.setdefault(defined, []).append(name)
    assert len(where) > 100
    shared = {name: places for name, places in where.items() if len(places) > 1}
    assert not shared, shared


def design_section(number: str) -> str:
    """The text of docs/design.md's section ``number`` (up to the next heading)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index(f"### {number} ")
    return text[start : text.index("\n#", start + 1)]


def test_the_design_draws_these_layers() -> None:
    """docs/design.md §6.2's table is LAYERS, and §6.1 names every package."""
    drawn = {
        package: int(row.split("|")[1])
        for row in design_section("6.2").splitlines()
        if row.startswith("| ") and row.split("|")[1].strip().isdigit()
        for package in re.findall(r"`(kvhit[\w.]*)`", row.split("|")[2])
    }
    assert drawn == dict(LAYERS)
    table = design_section("6.1")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert [p for p in config["packages"] if f"`{p}`" not in table] == []
