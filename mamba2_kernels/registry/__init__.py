"""The one place a kernel is declared: one ``KernelEntry`` per kernel of the Mamba-2 layer and per whole call,
with its stable name, the mamba-ssm kernel it replaces and its phase label (the launch order of
``../shared/notes/mamba_ssm.md`` section 2), a seeded input factory, the argument order its three
implementations share, a bytes and FLOPs model, and per-output tolerances (``entry``).

One module per family, the entries written with keyword arguments: ``ssd`` (the stages), ``norm``, ``conv``
and ``calls`` (the SSD call and the layer); ``inputs`` holds the input factories, ``models`` the bytes and
FLOPs. The factories, the models and the suites serve the tests and the guard, not a training job. They live
here, beside the kernels, because the kernels' own tests (which run with this package alone) and the guard's
bench and tuner must call the same three implementations on the same inputs; ``import mamba2_kernels`` does
not import this package, so a training job never loads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mamba2_kernels.registry import calls, conv, norm, ssd
from mamba2_kernels.registry.calls import SSD_CALL_STAGES
from mamba2_kernels.registry.entry import (
    COMPOSITE_PHASES,
    DEFAULT_TOLERANCE,
    FAMILIES,
    BaselineUnavailable,
    KernelEntry,
    MissingImplementation,
)
from mamba2_kernels.suites import unknown_name

__all__ = ["COMPOSITE_PHASES", "DEFAULT_TOLERANCE", "ENTRIES", "FAMILIES", "REGISTRY", "SSD_CALL_STAGES",
           "BaselineUnavailable", "KernelEntry", "MissingImplementation", "get", "seen_entries", "select",
           "tuned_kernel_names"]

ENTRIES: tuple[KernelEntry, ...] = (*ssd.ENTRIES, *norm.ENTRIES, *conv.ENTRIES, *calls.SSD, *calls.LAYER)
REGISTRY: dict[str, KernelEntry] = {e.name: e for e in ENTRIES}


def seen_entries(fell_back: Iterable[str]) -> list[str]:
    """The entries that launch the keys training jobs fell back at (given the kernels that fell back), as the
    jobs called them: the whole SSD call, and the layer when a conv or norm kernel fell back (they run in the
    layer's call only). The per-stage entries' inputs are plain (no z, one document, no initial states), so
    at a call pattern they launch other keys."""
    layer = any(REGISTRY[name].family in ("conv", "norm") for name in fell_back if name in REGISTRY)
    return [entry.name for entry in (*calls.SSD, *(calls.LAYER if layer else ()))]


def tuned_kernel_names() -> set[str]:
    """The names of every Helion kernel the entries launch: the names a config file's ``kernels:`` may use."""
    from mamba2_kernels._runtime import TUNED_KERNELS

    for entry in ENTRIES:
        if entry.has_helion:
            entry.helion_fn()  # imports the kernel's module, which defines its TunedKernels
    return set(TUNED_KERNELS)


def get(name: str) -> KernelEntry:
    if name not in REGISTRY:
        raise unknown_name("kernel", name, REGISTRY)
    return REGISTRY[name]


def select(names: Sequence[str] | None = None, family: str | None = None) -> list[KernelEntry]:
    """Entries by name (in the given order) or by family; all of them by default."""
    if family is not None and family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
    entries = [get(n) for n in names] if names else list(ENTRIES)
    return [e for e in entries if family is None or e.family == family]
