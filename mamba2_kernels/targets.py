"""Loading what a string names: ``"package.module:name"`` or ``"/path/file.py:name"``. Imports nothing heavy,
so the daemon's child processes can use it before torch is loaded."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def load_target(target: str) -> Any:
    """``"package.module:name"`` (a dotted name is looked up attribute by attribute) or
    ``"/path/file.py:name"`` -> the object. The one loader of everything named by a string."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"target: expected 'module:name' or '/path/file.py:name', got {target!r}")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_mamba2_guard_{abs(hash(where))}", where)
        if spec is None or spec.loader is None:
            raise ValueError(f"target: cannot load {where}")
        obj: Any = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(obj)
    else:
        obj = importlib.import_module(where)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj
