"""Types for numeric command-line flags and environment variables: range, type and meaning checked.

Each factory returns a function for argparse's ``type=``: it raises ``argparse.ArgumentTypeError``, which
argparse prints after the flag's name (``argument --rounds: expected an integer >= 1, got '0'``), exit 2.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

# A GPU's file name under mamba2_kernels/configs/ and baselines/ (``nvidia-h200``): nothing that leaves those folders.
_GPU_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {text!r}")
        return value

    return parse


def seconds(zero: bool = False) -> Callable[[str], float]:
    """A finite number of seconds, > 0 (>= 0 with ``zero``)."""
    return _amount("seconds", zero)


def minutes() -> Callable[[str], float]:
    """A finite number of minutes, > 0."""
    return _amount("minutes", zero=False)


def _amount(unit: str, zero: bool) -> Callable[[str], float]:
    bound = ">= 0" if zero else "> 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a number of {unit} {bound}, got {text!r}")
        return value

    return parse


def fraction(text: str) -> float:
    """A fraction in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def valid_gpu_slug(text: str | None) -> bool:
    """Whether ``text`` names a GPU's files without leaving their folders."""
    return bool(text) and _GPU_SLUG.fullmatch(text) is not None and ".." not in text


def gpu_slug(text: str) -> str:
    """A GPU slug, as ``mamba2_kernels.config_store.slugify`` makes them from GPU names."""
    if not valid_gpu_slug(text):
        raise argparse.ArgumentTypeError(f"expected a GPU slug such as nvidia-h200 (letters, digits, '.', '_', "
                                         f"'-'), got {text!r}")
    return text
