"""Swap mamba-ssm's ``mamba_chunk_scan_combined`` for the Helion drop-in, and back.

``patch_mamba_ssm()`` replaces ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` and the
same name in every already-imported ``mamba_ssm`` module that imported it (``mamba_ssm.modules.mamba2``,
``mamba2_simple``, ``ssd_minimal``); modules imported later pick the patched attribute up from
``ssd_combined``. ``unpatch_mamba_ssm()`` restores exactly what was replaced. Both are idempotent.
Only the non-fused path (``Mamba2(use_mem_eff_path=False)`` or direct calls) goes through this function;
``mamba_split_conv1d_scan_combined`` is not replaced.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

NAME = "mamba_chunk_scan_combined"
_lock = threading.Lock()
_original: Any = None
_replaced: list[str] = []  # modules whose attribute was swapped


def patch_mamba_ssm() -> list[str]:
    """Install the Helion ``mamba_chunk_scan_combined``; returns the modules patched."""
    global _original
    from kernels import _mamba_ssm
    from kernels.ssd.combined import mamba_chunk_scan_combined as ours

    with _lock:
        combined = _mamba_ssm.module("ops.triton.ssd_combined")
        if _original is None:
            _original = getattr(combined, NAME)
        for name, module in list(sys.modules.items()):
            if (name == "mamba_ssm" or name.startswith("mamba_ssm.")) and getattr(module, NAME, None) is _original:
                setattr(module, NAME, ours)
                _replaced.append(name)
        return list(_replaced)


def unpatch_mamba_ssm() -> list[str]:
    """Restore mamba-ssm's own function where ``patch_mamba_ssm`` replaced it; returns those modules."""
    global _original
    from kernels.ssd.combined import mamba_chunk_scan_combined as ours

    with _lock:
        restored = []
        for name in _replaced:
            module = sys.modules.get(name)
            if module is not None and getattr(module, NAME, None) is ours:
                setattr(module, NAME, _original)
                restored.append(name)
        _replaced.clear()
        _original = None
        return restored


def is_patched() -> bool:
    return bool(_replaced)
