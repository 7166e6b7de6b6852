"""Running the kernels and mamba-ssm on a CPU, for tests and the guard's CPU interpret mode.

Two ways to run a Helion kernel without a GPU (``../shared/notes/helion.md`` section 4):
  * ``ref``: Helion's eager reference mode (``HELION_INTERPRET=1``): the kernel body as PyTorch; block
    sizes are ignored (one full tile).
  * ``triton``: Helion's generated Triton code in Triton's interpreter (``TRITON_INTERPRET=1``): tiling and
    masking run for real. bf16 ``tl.dot`` is wrong there (triton-lang/triton#11584): use fp32/fp16.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` function is defined (mamba-ssm's kernels are
defined at import), so ``enable_cpu_interpret()`` must run before mamba-ssm's Triton modules are imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import types
import warnings
from collections.abc import Iterator

import torch

MODES = ("ref", "triton")
_patched = False


def enable_cpu_interpret() -> None:
    """Set the environment and apply the patches that CPU execution needs. Idempotent."""
    global _patched
    os.environ["TRITON_INTERPRET"] = "1"
    # mamba-ssm's autotuners need a driver to benchmark; deterministic mode collapses each to one config
    # (and mamba-ssm then suggests cached autotuning, which does not apply here).
    os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
    warnings.filterwarnings("ignore", message="Deterministic mode: set TRITON_CACHE_AUTOTUNING", category=UserWarning)
    if _patched:
        return
    _patched = True
    patch_mm_out_dtype()
    _patch_libdevice()
    _patch_cuda_queries()
    _skip_unasserted_overflow_checks()


def patch_mm_out_dtype() -> None:
    """Helion's ref mode calls torch.mm/bmm(..., out_dtype=...), a CUDA-only overload: on CPU tensors compute in
    fp32 and cast. Idempotent; ``mamba2_kernels._runtime`` applies it when it first runs a kernel on CPU in ref mode."""
    for name in ("mm", "bmm"):
        original = getattr(torch, name)
        if getattr(original, "_cpu_out_dtype", False):
            continue

        @functools.wraps(original)  # inductor registers extern kernels by __name__
        def patched(a, b, *args, out_dtype=None, _original=original, **kwargs):
            if out_dtype is None or a.device.type != "cpu":
                return _original(a, b, *args, **({"out_dtype": out_dtype} if out_dtype else {}), **kwargs)
            return _original(a.float(), b.float(), *args, **kwargs).to(out_dtype)

        patched._cpu_out_dtype = True  # type: ignore[attr-defined]
        setattr(torch, name, patched)


def _patch_libdevice() -> None:
    # Helion emits libdevice.exp etc.; the interpreter never implements those stubs, tl.math has them.
    import triton.language as tl
    from triton.language.extra import libdevice

    # Look tl.math up at call time: the interpreter swaps its functions in only while a kernel runs.
    def forward(name):
        return lambda *args, **kwargs: getattr(tl.math, name)(*args, **kwargs)

    for name in dir(libdevice):
        if not name.startswith("_") and hasattr(tl.math, name):
            setattr(libdevice, name, forward(name))


def _patch_cuda_queries() -> None:
    if torch.cuda.is_available():
        return
    # mamba-ssm wraps launches in torch.cuda.device(x.device.index) and sizes grids by the SM count.
    torch.cuda.device = lambda *args, **kwargs: contextlib.nullcontext()
    torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(
        multi_processor_count=132, name="cpu-interpreter"
    )


def _skip_unasserted_overflow_checks() -> None:
    # Triton's interpreter builds an overflow check around every integer add, sub and mul, and then, with debug
    # off, drops the assert the check feeds (``device_assert``), as a GPU build does: the checks only cost time,
    # about half of an interpreted kernel's. With debug on, they assert, and stay.
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


@contextlib.contextmanager
def execution_mode(mode: str) -> Iterator[None]:
    """Run Helion kernels on CPU tensors in ``ref`` or ``triton`` (interpreter) mode inside the block."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    enable_cpu_interpret()
    previous = os.environ.get("HELION_INTERPRET")
    if mode == "ref":
        os.environ["HELION_INTERPRET"] = "1"
    else:
        os.environ.pop("HELION_INTERPRET", None)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HELION_INTERPRET", None)
        else:
            os.environ["HELION_INTERPRET"] = previous


def column_slice(shape, dtype=torch.float32, row_dims: int = 2, pad: tuple[int, int] = (3, 5)):
    """(view, buffer): a NaN-filled view of ``shape`` whose rows (its first ``row_dims`` dimensions) are a
    column slice of a wider buffer, as the layer's gradient slices are. A kernel that fills the view leaves
    no NaN in it, and one that writes beside it shows in the buffer's padding."""
    rows, inner = tuple(shape[:row_dims]), tuple(shape[row_dims:])
    width = math.prod(inner)
    buffer = torch.full((*rows, pad[0] + width + pad[1]), float("nan"), dtype=dtype)
    return buffer[..., pad[0]:pad[0] + width].unflatten(-1, inner), buffer
