"""The environment variables the kernels' host code reads at every launch, read once per public call.

``os.environ.get`` costs one or two microseconds (the name's encoding, and a KeyError caught for a variable
that is not set), and an eager training step's SSD call read the same few variables some thirty times: each
launch's execution mode, each fused stage's forced path and the GPU slug's override. Inside ``read_once()`` a
variable's first read in this thread holds until the block ends; outside it, every read is fresh. So a change
to the environment reaches the next public call, never the middle of one. No torch here: the CLI's fast paths
import this before anything loads.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_held = threading.local()


def get(name: str) -> str | None:
    """``os.environ.get(name)``, or inside ``read_once()`` the value its first read in the block found."""
    values = getattr(_held, "values", None)
    if values is None:
        return os.environ.get(name)
    try:
        return values[name]
    except KeyError:
        value = values[name] = os.environ.get(name)
        return value


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Hold each variable's first read in this thread until the block ends (an inner block joins the outer's)."""
    if getattr(_held, "values", None) is not None:
        yield
        return
    _held.values = {}
    try:
        yield
    finally:
        _held.values = None
