"""Helion drop-in replacements for mamba-ssm's Mamba-2 kernels.

A training job imports this package; it never imports ``mamba2_guard``. Public functions are loaded lazily
so that ``import mamba2_kernels`` stays cheap and does not import helion or mamba-ssm.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> "module:attribute"; a name appears here once its implementation exists.
_PUBLIC = {
    "mamba_chunk_scan_combined": "mamba2_kernels.ssd.combined:mamba_chunk_scan_combined",
    "mamba_split_conv1d_scan_combined": "mamba2_kernels.layer_fn:mamba_split_conv1d_scan_combined",
    "causal_conv1d_fn": "mamba2_kernels.conv.causal_conv1d:causal_conv1d_fn",
    "rmsnorm_fn": "mamba2_kernels.norm.rmsnorm:rmsnorm_fn",
    "RMSNormGated": "mamba2_kernels.norm.rmsnorm:RMSNormGated",
    "patch_mamba_ssm": "mamba2_kernels.layer:patch_mamba_ssm",
    "unpatch_mamba_ssm": "mamba2_kernels.layer:unpatch_mamba_ssm",
    "registry": "mamba2_kernels.registry",
    "config_store": "mamba2_kernels.config_store",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    target = _PUBLIC.get(name)
    if target is None:
        raise AttributeError(f"module 'mamba2_kernels' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


def __dir__() -> list[str]:
    """The public names too, though they load lazily: what ``dir()`` and a REPL's completion show."""
    return sorted({*globals(), *_PUBLIC})
