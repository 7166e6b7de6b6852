"""Helion drop-in replacements for mamba-ssm's Mamba-2 kernels.

A training job imports this package; it never imports ``guard``. Public functions are loaded lazily so
that ``import kernels`` stays cheap and does not import helion or mamba-ssm.

Note: Hugging Face's ``kernels`` distribution uses the same import name. ``guard`` checks at start-up
that this package is the one imported (see ``IS_MAMBA2_GUARD``).
"""

from __future__ import annotations

import importlib
from typing import Any

# The marker that tells this package apart from Hugging Face's `kernels`.
IS_MAMBA2_GUARD = True

# public name -> "module:attribute"; a name appears here once its implementation exists.
_PUBLIC = {
    "mamba_chunk_scan_combined": "kernels.ssd.combined:mamba_chunk_scan_combined",
    "mamba_split_conv1d_scan_combined": "kernels.layer_fn:mamba_split_conv1d_scan_combined",
    "causal_conv1d_fn": "kernels.conv.causal_conv1d:causal_conv1d_fn",
    "rmsnorm_fn": "kernels.norm.rmsnorm:rmsnorm_fn",
    "RMSNormGated": "kernels.norm.rmsnorm:RMSNormGated",
    "patch_mamba_ssm": "kernels.layer:patch_mamba_ssm",
    "unpatch_mamba_ssm": "kernels.layer:unpatch_mamba_ssm",
    "registry": "kernels.registry",
    "config_store": "kernels.config_store",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    target = _PUBLIC.get(name)
    if target is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module
