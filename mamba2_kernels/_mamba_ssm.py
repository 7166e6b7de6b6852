"""Loads mamba-ssm's Triton kernel wrappers and pure-PyTorch references.

``mamba_ssm/__init__.py`` imports ``selective_scan_cuda``, a CUDA extension that a CPU or offline install
(``MAMBA_SKIP_CUDA_BUILD=TRUE``) does not have, so a plain ``import mamba_ssm.ops.triton.ssd_combined``
fails. When that extension is missing, this module registers ``mamba_ssm`` as a bare package whose
submodules load from the installed files, skipping the package ``__init__``. The Triton kernels and
references need only torch, triton and einops.

mamba-ssm autotunes its Triton kernels in every process; the loader makes those picks persist in Triton's
on-disk cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``), so that the reference stays the same
kernel from run to run. Deleting that cache makes mamba-ssm pick again.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from mamba2_kernels.ssd import compose

SUPPORTED = "2.3."


class MambaSsmUnavailable(ImportError):
    """mamba-ssm (the reference implementation) is not installed, or not a supported version."""


def installed_version() -> str | None:
    try:
        return version("mamba-ssm")
    except PackageNotFoundError:
        return None


def _ensure_package() -> None:
    if "mamba_ssm" in sys.modules:
        return
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None or not spec.submodule_search_locations:
        raise MambaSsmUnavailable(
            "mamba-ssm is not installed; it is the reference the guard compares against. Install it with "
            "scripts/install.sh (it builds mamba-ssm==2.3.2.post1 without its CUDA extension)."
        )
    if importlib.util.find_spec("selective_scan_cuda") is not None:
        importlib.import_module("mamba_ssm")
        return
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__spec__ = spec
    package.__version__ = installed_version()
    sys.modules["mamba_ssm"] = package


def module(name: str) -> types.ModuleType:
    """A mamba-ssm submodule, e.g. ``module("ops.triton.ssd_combined")``."""
    loaded = sys.modules.get(f"mamba_ssm.{name}")
    if loaded is not None and "mamba_ssm" in sys.modules:
        return loaded  # set up when imported: timed baselines resolve per call, and the set-up takes 0.5 ms
    _ensure_package()
    try:
        loaded = importlib.import_module(f"mamba_ssm.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("mamba_ssm"):
            raise MambaSsmUnavailable(
                f"mamba-ssm {installed_version()} has no module mamba_ssm.{name}; supported: {SUPPORTED}x"
            ) from exc
        raise
    keep_autotune_picks()
    return loaded


def resolve(target: str) -> Any:
    """``"ops.triton.ssd_bmm:_bmm_chunk_fwd"`` -> the function."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        raise ValueError(f"target: expected 'module:attribute', got {target!r}")
    return getattr(module(module_name), attr)


# Where each wrapper and reference lives, for ``resolve``.
SSD_CHUNK_STATE = "ops.triton.ssd_chunk_state"
SSD_STATE_PASSING = "ops.triton.ssd_state_passing"
SSD_BMM = "ops.triton.ssd_bmm"
SSD_CHUNK_SCAN = "ops.triton.ssd_chunk_scan"
SSD_COMBINED = "ops.triton.ssd_combined"
LAYERNORM_GATED = "ops.triton.layernorm_gated"
SSD_MINIMAL = "modules.ssd_minimal"


def dcb_and_intra_ddA(x, dt, dA_cumsum, dout, seq_idx=None, CB=None, ngroups=1):
    """dCB and the intra-chunk ddA as mamba-ssm's combined backward computes them: its dCB kernel, then its
    stable ddA kernel over the same products (its dCB kernel's own CB= form is unused there and has no
    seq_idx support). The counterpart of our dCB kernel's CB= form."""
    scan = module(SSD_CHUNK_SCAN)
    dcb = scan._chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, seq_idx=seq_idx, ngroups=ngroups)
    return dcb, scan._chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, CB)


def chunk_cumsum_bwd_of_terms(intra_steps, next_steps, prev_parts, chunk_grad, ddt_out, dt, A, dt_bias=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """The counterpart of our last backward stage: the ddA terms finished and combined by PyTorch ops (as
    mamba-ssm's combined backward adds its own), then mamba-ssm's chunk_cumsum backward kernel."""
    from mamba2_kernels.ssd import naive

    ddA = naive.combine_ddA_terms(*naive.finish_ddA_terms(intra_steps, next_steps, prev_parts), chunk_grad)
    return module(SSD_CHUNK_STATE)._chunk_cumsum_bwd(ddA, ddt_out, dt, A, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                     dt_limit=dt_limit)


def _stages() -> types.SimpleNamespace:
    """mamba-ssm's stage wrappers that ``mamba2_kernels.ssd.compose``'s chains call, under the stage names."""
    return types.SimpleNamespace(
        chunk_cumsum_fwd=resolve(f"{SSD_CHUNK_STATE}:_chunk_cumsum_fwd"),
        chunk_state_passing_fwd=chunk_state_passing_fwd, bmm_chunk_scan_fwd=bmm_chunk_scan_fwd,
        chunk_state_fwd=resolve(f"{SSD_CHUNK_STATE}:_chunk_state_fwd"),
        state_passing_fwd=resolve(f"{SSD_STATE_PASSING}:_state_passing_fwd"),
        chunk_scan_bwd_dstates=resolve(f"{SSD_CHUNK_SCAN}:_chunk_scan_bwd_dstates"),
        state_passing_bwd=resolve(f"{SSD_STATE_PASSING}:_state_passing_bwd"),
        bmm_chunk_fwd=resolve(f"{SSD_BMM}:_bmm_chunk_fwd"), chunk_scan_fwd=resolve(f"{SSD_CHUNK_SCAN}:_chunk_scan_fwd"),
        chunk_scan_bwd_dcb=dcb_and_intra_ddA,
        chunk_state_bwd_db=resolve(f"{SSD_CHUNK_STATE}:_chunk_state_bwd_db"),
        chunk_scan_bwd_dC=resolve(f"{SSD_CHUNK_SCAN}:_chunk_scan_bwd_dC"),
        bmm_chunk_bwd=resolve(f"{SSD_BMM}:_bmm_chunk_bwd"))


def chunk_state_passing_fwd(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, out_dtype=None):
    """mamba-ssm's chunk_state then state_passing kernels, as its combined forward runs them: the
    counterpart of ``mamba2_kernels.ssd.chunk_state_passing``."""
    return compose.chain_chunk_state_passing(_stages(), B, x, dt, dA_cumsum, initial_states, seq_idx, out_dtype)


def chunk_cumsum_state_passing_fwd(dt, A, B, x, chunk_size, dt_bias=None, dt_softplus=False,
                                   dt_limit=(0.0, float("inf")), initial_states=None, seq_idx=None, out_dtype=None):
    """mamba-ssm's chunk_cumsum, chunk_state and state_passing kernels, as its combined forward runs them: the
    counterpart of ``mamba2_kernels.ssd.chunk_state_passing.chunk_cumsum_state_passing_fwd``."""
    return compose.chain_chunk_cumsum_state_passing(_stages(), dt, A, B, x, chunk_size, dt_bias=dt_bias,
                                                    dt_softplus=dt_softplus, dt_limit=dt_limit,
                                                    initial_states=initial_states, seq_idx=seq_idx,
                                                    out_dtype=out_dtype)


def bmm_chunk_scan_fwd(x, dt, dA_cumsum, B, C, states, D=None, z=None, seq_idx=None):
    """mamba-ssm's bmm_chunk then chunk_scan kernels, as its combined forward runs them: the counterpart of
    ``mamba2_kernels.ssd.chunk_scan.bmm_chunk_scan_fwd``."""
    return compose.chain_bmm_chunk_scan(_stages(), x, dt, dA_cumsum, B, C, states, D=D, z=z, seq_idx=seq_idx)


def chunk_state_passing_scan_fwd(x, dt, dA_cumsum, B, C, D=None, z=None, initial_states=None, seq_idx=None):
    """mamba-ssm's chunk_state, state_passing, bmm_chunk and chunk_scan kernels, as its combined forward runs them:
    the counterpart of ``mamba2_kernels.ssd.ssd_fused_fwd``. Returns (out, out_x or None, final_states)."""
    return compose.chain_chunk_state_passing_scan(_stages(), x, dt, dA_cumsum, B, C, D=D, z=z,
                                                  initial_states=initial_states, seq_idx=seq_idx)


def chunk_state_passing_bwd(C, dA_cumsum, dout, states, dfinal_states=None, seq_idx=None, has_initial_states=False,
                            dstates_dtype=None, states_dtype=None):
    """mamba-ssm's dstates then state passing backward kernels, as its combined backward runs them: the
    counterpart of ``mamba2_kernels.ssd.chunk_state_passing_bwd``."""
    return compose.chain_chunk_state_passing_bwd(_stages(), C, dA_cumsum, dout, states, dfinal_states, seq_idx,
                                                 has_initial_states, dstates_dtype, states_dtype)


def bmm_chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, B, C, seq_idx=None, ngroups=1):
    """mamba-ssm's bmm_chunk kernel, then its dCB and stable ddA kernels, as its combined backward runs them: the
    counterpart of ``mamba2_kernels.ssd.chunk_scan_bwd.bmm_chunk_scan_bwd_dcb``."""
    return compose.chain_bmm_chunk_scan_bwd_dcb(_stages(), x, dt, dA_cumsum, dout, B, C, seq_idx=seq_idx,
                                                ngroups=ngroups)


def chunk_bwd_db_dc(x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx=None, dB=None, dC=None):
    """mamba-ssm's db and dC kernels, then its bmm_chunk_bwd twice, as its combined backward runs them: the
    counterpart of ``mamba2_kernels.ssd.chunk_bwd_db_dc``."""
    return compose.chain_chunk_bwd_db_dc(_stages(), x, dt, dA_cumsum, B, C, dout, states, dstates, dcb,
                                         seq_idx=seq_idx, dB=dB, dC=dC)


def _autotuners() -> dict[str, Any]:
    """mamba-ssm's autotuned Triton kernels loaded so far, as ``"ops.triton.ssd_bmm:_bmm_chunk_fwd_kernel"``."""
    from triton.runtime.autotuner import Autotuner

    return {f"{name.removeprefix('mamba_ssm.')}:{attr}": value
            for name, mod in list(sys.modules.items()) if name.startswith("mamba_ssm.") and mod is not None
            for attr, value in vars(mod).items() if isinstance(value, Autotuner)}


def keep_autotune_picks() -> None:
    """Make mamba-ssm's Triton autotuners store their picks in Triton's on-disk cache (keyed by triton,
    backend, kernel source, shape key and config list), so every process times the same mamba-ssm kernel:
    otherwise each process re-tunes and may pick another config, which moves the reference that the
    guard's speedups are measured against. The interpreter has no disk cache."""
    from triton import knobs

    if knobs.runtime.interpret:
        return
    for tuner in _autotuners().values():
        tuner.cache_results = True


def forget_last_picks() -> None:
    """Clear each autotuner's ``best_config`` (Triton sets it on every call), so ``last_picks`` afterwards
    names only the kernels called in between."""
    for tuner in _autotuners().values():
        tuner.best_config = None


def last_picks() -> dict[str, str]:
    """The config each mamba-ssm autotuner last ran with, for those called since ``forget_last_picks``."""
    return {name: str(tuner.best_config) for name, tuner in sorted(_autotuners().items())
            if getattr(tuner, "best_config", None) is not None}
