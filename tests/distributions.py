"""Installed distributions and what they require: which packages a set of dependencies brings with it."""

from __future__ import annotations

import re
from importlib import metadata

from packaging.requirements import Requirement


def name_of(spec: str) -> str:
    """A requirement's distribution name, normalized: '"helion>=1.4,<2"' -> 'helion'."""
    return re.split(r"[<>=!~ \[;]", spec.strip('"'), maxsplit=1)[0].lower().replace("_", "-")


def closure(names: set[str]) -> set[str]:
    """The installed distributions that ``names`` need, transitively (requirements behind extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        requirements = [Requirement(r) for r in requires]
        todo += [name_of(r.name) for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen
