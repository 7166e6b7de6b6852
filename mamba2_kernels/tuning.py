"""The kernels' public tuning surface: everything ``mamba2_guard`` (the tuner, the bench, the selection fit,
the dev tools) uses of the library, and nothing a training job needs. The guard imports no private name of
``mamba2_kernels``; ``tests/guard/test_layers.py`` enforces it.

Launches
    ``capture_launches()``  record every Helion launch (kernel, exact arguments) of the calls in the block
    ``pinned_config(kernel, config, key)``  run a kernel on a given config inside the block
    ``tuned_kernels()``     name -> ``TunedKernel`` of every Helion kernel the registry's entries launch
Configs
    ``adapt_config(bound, config, other_key)``  a stored config fitted to a bound call (per-load lists, tunables)
    ``complete_config`` / ``validate_config``   the same for a kernel and its arguments; why a config is invalid
    ``config_error(bound, config)``             why a config does not generate code for a bound kernel, or None
    ``launch_error(kernel, args, config)``      why a config does not launch on this GPU (shared memory), or None
    ``device_slug(device)`` / ``device_capability(device)``  which config file serves a device
Precision
    ``scaled_atol(expected, atol)``  the rms-scaled absolute tolerance of Helion's own accuracy check
References
    ``load_target("module:function")``  a function by name (registry entries, test tuners); also in
                   ``mamba2_kernels.targets``, which imports nothing heavy (the daemon's and tuner's children)
    ``mamba_ssm``  the loader of mamba-ssm's Triton kernels (``module``, ``keep_autotune_picks``,
                   ``forget_last_picks``, ``last_picks``)
"""

from __future__ import annotations

from typing import Any

from mamba2_kernels import _mamba_ssm as mamba_ssm
from mamba2_kernels._runtime import (
    TUNED_KERNELS,
    TunedKernel,
    adapt_config,
    capture_launches,
    complete_config,
    device_capability,
    device_slug,
    launch_error,
    pinned_config,
    scaled_atol,
    validate_config,
)
from mamba2_kernels._runtime import _config_error as config_error
from mamba2_kernels.targets import load_target

__all__ = ["TunedKernel", "adapt_config", "capture_launches", "complete_config", "config_error", "device_capability",
           "device_slug", "launch_error", "load_target", "mamba_ssm", "pinned_config", "scaled_atol", "tuned_kernels",
           "validate_config"]


def tuned_kernels() -> dict[str, Any]:
    """Name -> ``TunedKernel`` of every Helion kernel the registry's entries launch (their modules imported)."""
    from mamba2_kernels import registry

    registry.tuned_kernel_names()
    return dict(TUNED_KERNELS)
