"""Swap mamba-ssm's Mamba-2 kernels for the Helion drop-ins, and back.

``patch_mamba_ssm()`` makes a ``mamba_ssm.modules.mamba2.Mamba2`` (and ``Mamba2Simple``) run the Helion
kernels in both ``use_mem_eff_path`` modes, and so does model code that took mamba-ssm's functions when it
was imported, before or after the patch: by name (a hub model's remote code, transformers 4's modeling
files), or inside a wrapper (transformers 5's modeling files: their hub-kernel fallback keeps the function it
resolved in its closure). By identity (so aliases such as ``mamba2.RMSNormGated`` are found too), in every
imported module but this package's own, it replaces the module attributes that hold them, and the closure
cells that hold them in the module's functions (or in the ``forward`` of a function-like object, which
Hugging Face's ``kernels`` makes of transformers' wrappers), up to three wrappers deep:

  * ``ssd_combined.mamba_chunk_scan_combined``         -> ``mamba2_kernels.ssd.combined.mamba_chunk_scan_combined``
  * ``ssd_combined.mamba_split_conv1d_scan_combined``  -> ``mamba2_kernels.layer_fn.mamba_split_conv1d_scan_combined``
  * ``layernorm_gated.rmsnorm_fn``                     -> ``mamba2_kernels.norm.rmsnorm.rmsnorm_fn``
  * ``layernorm_gated.RMSNorm`` (``RMSNormGated``)      -> ``mamba2_kernels.norm.rmsnorm.RMSNormGated``

and sets ``causal_conv1d_fn`` in ``mamba_ssm.modules.mamba2`` and ``mamba2_simple`` (causal-conv1d's function,
or None without that package, where the layer falls back to ``nn.Conv1d``) to
``mamba2_kernels.conv.causal_conv1d.causal_conv1d_fn``. It imports those two modules first (skipping one whose
import fails, e.g. without huggingface_hub). Modules imported later pick the patched attributes up from
``ssd_combined`` / ``layernorm_gated``.

Model code that imported causal-conv1d's ``causal_conv1d_fn`` itself keeps it (ours takes no initial states).

``unpatch_mamba_ssm()`` restores exactly what was there, also in mamba-ssm's modules imported while patched
(another module imported while patched keeps what it imported: ours). Both are idempotent. Already-built
``Mamba2`` modules follow the patch both ways (their norm's forward calls the module-level ``rmsnorm_fn``); a
``Mamba2`` *built* while patched keeps its Helion ``RMSNormGated`` instance after unpatching (same parameters
and state_dict). ``Mamba2.step`` (decoding) is not touched.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from mamba2_kernels.targets import load_target

# (mamba-ssm module, attribute, ours as "module:attribute")
SWAPS = (
    ("ops.triton.ssd_combined", "mamba_chunk_scan_combined", "mamba2_kernels.ssd.combined:mamba_chunk_scan_combined"),
    ("ops.triton.ssd_combined", "mamba_split_conv1d_scan_combined",
     "mamba2_kernels.layer_fn:mamba_split_conv1d_scan_combined"),
    ("ops.triton.layernorm_gated", "rmsnorm_fn", "mamba2_kernels.norm.rmsnorm:rmsnorm_fn"),
    ("ops.triton.layernorm_gated", "RMSNorm", "mamba2_kernels.norm.rmsnorm:RMSNormGated"),
)
# Modules that import causal-conv1d's ``causal_conv1d_fn`` under a guard (None when it is not installed).
CONV_MODULES = ("modules.mamba2", "modules.mamba2_simple")
CONV_NAME = "causal_conv1d_fn"
CONV_OURS = "mamba2_kernels.conv.causal_conv1d:causal_conv1d_fn"

_lock = threading.Lock()
_originals: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, ours)
_saved: dict[tuple[str, str], Any] = {}  # (module name, attribute) -> the value before patching
_saved_cells: dict[int, tuple[str, Any, Any]] = {}  # id(closure cell) -> (module name, cell, the value before)
# How many wrappers deep the closures are searched: transformers 5 with Hugging Face's `kernels` needs two
# (a function-like module's forward, then the fallback wrapper that holds mamba-ssm's function); one more
# leaves room for a decorator on top.
_CLOSURE_DEPTH = 3


def _mamba_modules() -> list[tuple[str, Any]]:
    return [(name, module) for name, module in list(sys.modules.items())
            if module is not None and (name == "mamba_ssm" or name.startswith("mamba_ssm."))]


def _in_this_package(module_name: Any) -> bool:
    own = __name__.partition(".")[0]
    return module_name == own or str(module_name).startswith(own + ".")


def _holders() -> list[tuple[str, Any]]:
    """Every imported module that may hold mamba-ssm's objects: a model's code (Hugging Face's modeling files,
    a hub model's remote code) imports them by name, often before a job patches. Not this package's modules,
    which hold ours on purpose."""
    return [(name, module) for name, module in list(sys.modules.items())
            if module is not None and not _in_this_package(name)]


def _ours_for(value: Any) -> Any:
    """Ours in place of ``value`` where it is one of mamba-ssm's objects that the patch replaces, else None."""
    pair = _originals.get(id(value))
    return pair[1] if pair is not None and pair[0] is value else None


def patch_mamba_ssm() -> list[str]:
    """Install the Helion kernels; returns the names of the modules patched (sorted)."""
    from mamba2_kernels import _mamba_ssm

    if "mamba_ssm" not in sys.modules and importlib.util.find_spec("mamba_ssm") is None:
        # transformers and model code call mamba-ssm's kernels only where it is installed
        raise _mamba_ssm.MambaSsmUnavailable(
            "patch_mamba_ssm: mamba-ssm is not installed, so nothing here runs its kernels and there is nothing "
            "to replace; call mamba2_kernels.mamba_chunk_scan_combined or mamba_split_conv1d_scan_combined directly"
        )
    with _lock:
        for source_name, attr, target in SWAPS:
            ours = load_target(target)
            current = getattr(_mamba_ssm.module(source_name), attr)
            if current is not ours and id(current) not in _originals:
                _originals[id(current)] = (current, ours)
        conv_modules = []
        for name in CONV_MODULES:
            try:
                conv_modules.append(_mamba_ssm.module(name))
            except ImportError:  # e.g. mamba2.py needs huggingface_hub
                continue
        for name, module in _holders():
            try:
                held = list(vars(module).items())
            except TypeError:  # an object without a __dict__ that put itself in sys.modules
                continue
            for attr, value in held:
                ours = _ours_for(value)
                if ours is not None:
                    _saved.setdefault((name, attr), value)
                    setattr(module, attr, ours)
                    continue
                for cell in _closure_cells(value, _CLOSURE_DEPTH, set()):
                    held_there = cell.cell_contents
                    ours = _ours_for(held_there)
                    if ours is not None:
                        _saved_cells.setdefault(id(cell), (name, cell, held_there))
                        cell.cell_contents = ours
        conv = load_target(CONV_OURS)
        for module in conv_modules:
            if hasattr(module, CONV_NAME) and getattr(module, CONV_NAME) is not conv:
                _saved.setdefault((module.__name__, CONV_NAME), getattr(module, CONV_NAME))
                setattr(module, CONV_NAME, conv)
        return sorted({name for name, _ in _saved} | {name for name, _, _ in _saved_cells.values()})


def _closure_cells(value: Any, depth: int, seen: set[int]) -> Iterator[Any]:
    """The filled closure cells of ``value`` (a function, or an object whose class defines ``forward``) and of
    the functions those cells hold, ``depth`` wrappers deep; not this package's functions."""
    if depth <= 0 or id(value) in seen:
        return
    seen.add(id(value))
    # type(), not isinstance(): the latter reads ``__class__``, which some module attributes warn on
    function = value if type(value) is types.FunctionType else vars(type(value)).get("forward")
    if type(function) is not types.FunctionType or not function.__closure__ or _in_this_package(function.__module__):
        return
    for cell in function.__closure__:
        try:
            held = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        yield cell
        if type(held) is types.FunctionType:
            yield from _closure_cells(held, depth - 1, seen)


def unpatch_mamba_ssm() -> list[str]:
    """Restore mamba-ssm's own objects wherever ``patch_mamba_ssm`` put ours; returns those modules."""
    with _lock:
        restored = set()
        conv = load_target(CONV_OURS)
        original_by_ours = {id(ours): original for original, ours in _originals.values()}
        for (name, attr), value in _saved.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            current = getattr(module, attr, None)
            if current is conv or id(current) in original_by_ours:
                setattr(module, attr, value)
                restored.add(name)
        for name, cell, value in _saved_cells.values():
            if id(cell.cell_contents) in original_by_ours:
                cell.cell_contents = value
                restored.add(name)
        # mamba-ssm's modules imported while patched copied ours from ssd_combined / layernorm_gated. (Other
        # modules imported while patched keep ours: they cannot be told apart from code that imports ours.)
        for name, module in _mamba_modules():
            for attr, value in list(vars(module).items()):
                original = original_by_ours.get(id(value))
                if original is not None and (name, attr) not in _saved:
                    setattr(module, attr, original)
                    restored.add(name)
        _saved.clear()
        _saved_cells.clear()
        _originals.clear()
        return sorted(restored)


def is_patched() -> bool:
    return bool(_saved or _saved_cells)
