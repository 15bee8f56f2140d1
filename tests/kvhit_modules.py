"""The distribution's modules, read from pyproject.toml: each ``kvhit.*`` name and its
file, for the tests that walk every module (layering, doctests)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def folder_of(package: str, package_dir: dict[str, str]) -> Path:
    """The folder of ``package``: its own package-dir entry, or its parent's folder
    and its last name."""
    if package in package_dir:
        return ROOT / package_dir[package]
    parent, _, last = package.rpartition(".")
    return folder_of(parent, package_dir) / last


def modules() -> dict[str, Path]:
    """Every module of the distribution, by its kvhit.* name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = {}
    for package in config["packages"]:
        for path in sorted(folder_of(package, config["package-dir"]).glob("*.py")):
            if path.stem == "__main__":
                continue
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out
