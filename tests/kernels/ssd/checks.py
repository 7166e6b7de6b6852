"""What the SSD kernel tests share: the shapes, the comparisons, seq_idx rows, and which registry entries a
set of kernel modules implements (so that a new entry is tested without being listed again)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from mamba2_kernels import config_store, registry, suites
from mamba2_kernels._runtime import TunedKernel, capture_launches, scaled_atol
from mamba2_kernels.testing import execution_mode

Runs = dict[str, tuple[registry.KernelEntry, Callable[..., Any]]]

SMOKE = suites.load().shape("smoke")  # b1 L96 h4 p16 g2 n16 Q32 fp32
# Interpreter shape: p32 n16 Q32 h4 g2 (2 heads per group), ragged last chunk.
TILED = SMOKE.replace(headdim=32, seqlen=80, batch=2)
# Odd shapes for ref mode, as replacements of SMOKE's fields.
ODD = {
    "smoke": {},
    "ragged": {"seqlen": 80},  # not a multiple of chunk_size
    "g1": {"ngroups": 1, "seqlen": 70},
    "g_eq_h": {"ngroups": 4},
    "p32": {"headdim": 32, "batch": 2, "seqlen": 50},
}


def entries_of(modules: tuple[ModuleType, ...]) -> tuple[str, ...]:
    """The names of the registry entries whose Helion implementation is in one of ``modules``, in registry
    order (the whole calls excluded: they compose many modules)."""
    names = {m.__name__ for m in modules}
    return tuple(e.name for e in registry.ENTRIES
                 if e.helion and e.helion.split(":")[0] in names and not e.phase.startswith(registry.COMPOSITE_PHASES))


def f64(value):
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def close(ours, ref, atol=1e-4, rtol=1e-4, label=""):
    """Every output of ``ref`` (a dict by name, or a sequence) in ``ours``, of its shape and within tolerance."""
    if isinstance(ref, dict):
        assert set(ref) <= set(ours), (sorted(ours), sorted(ref))
        pairs = [(name, ours[name], ref[name]) for name in ref]
    else:
        assert len(ours) == len(ref)
        pairs = [(f"{label}[{i}]", a, b) for i, (a, b) in enumerate(zip(ours, ref, strict=True))]
    for name, got, expected in pairs:
        if expected is None:
            assert got is None, name
            continue
        assert got.shape == expected.shape, (name, got.shape, expected.shape)
        torch.testing.assert_close(got.double(), expected.double(), atol=atol, rtol=rtol, msg=name)


def seq_idx_rows(batch: int, seqlen: int) -> torch.Tensor:
    """Row 0: sequences from 20 and 64 (a chunk border at chunk 32); row 1: from 50."""
    row = torch.zeros(seqlen, dtype=torch.int32)
    row[20:] = 1
    row[64:] = 2
    rows = [row, (torch.arange(seqlen) >= 50).to(torch.int32)]
    return torch.stack(rows[:batch]).contiguous()


def reset_dispatch(modules: tuple[ModuleType, ...]) -> None:
    """Forget the configs the tuned kernels of ``modules`` picked, so that the next launch looks them up again."""
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, TunedKernel):
                value.forget_dispatch()


def assert_ref_mode_matches_reference(name: str, shape) -> None:
    """The entry's Helion function in ref mode against its fp64 reference, output dtypes as the reference's."""
    entry = registry.get(name)
    inputs = entry.inputs(shape, 0)
    with execution_mode("ref"):
        ours = entry.run_helion(inputs)
    close(ours, entry.run_reference(inputs))
    for key, value in entry.run_reference(inputs, dtype=None).items():
        assert ours[key].dtype == value.dtype, (key, ours[key].dtype, value.dtype)


@contextlib.contextmanager
def small_block_configs(directory: Path, runs: Runs, configs: dict[str, dict[str, Any]],
                        modules: tuple[ModuleType, ...]) -> Iterator[config_store.ConfigFile]:
    """A cpu.yaml holding ``configs[kernel]`` for every launch of ``runs`` at TILED, and lookups pointed at it."""
    cf = config_store.ConfigFile(tuned={"note": "test: small blocks"})
    for entry, fn in runs.values():
        with execution_mode("ref"), capture_launches() as launches:
            entry._call(fn, entry.inputs(TILED, 0))
        for tk, kargs in launches:
            cf.put(tk.name, tk.shape_key(*kargs), {**configs[tk.name], "num_warps": 4})
    config_store.save(directory / "cpu.yaml", cf)
    mp = pytest.MonkeyPatch()
    mp.setattr(config_store, "CONFIG_DIR", directory)
    mp.setenv("MAMBA2_GUARD_GPU_SLUG", "cpu")
    reset_dispatch(modules)
    try:
        yield cf
    finally:
        mp.undo()
        reset_dispatch(modules)


def assert_interpreter_matches_reference(entry: registry.KernelEntry, fn: Callable[..., Any]) -> None:
    """``fn`` in Triton's interpreter at TILED, every launch on its stored (small-block) config."""
    inputs = entry.inputs(TILED, 0)
    before = config_store.FALLBACKS.copy()
    with execution_mode("triton"):
        ours = entry._call(fn, inputs)
    assert before == config_store.FALLBACKS, "a launch missed its small-block config"
    close(ours, entry.run_reference(inputs))


def assert_interpreter_matches_mamba_ssm(names: tuple[str, ...], modules: tuple[ModuleType, ...]) -> None:
    """Each entry's Helion function on its default config against mamba-ssm's kernel, both in Triton's
    interpreter at the smoke shape: the same values and dtypes."""
    reset_dispatch(modules)
    try:
        for name in names:
            entry = registry.get(name)
            inputs = entry.inputs(SMOKE, 0)
            with execution_mode("triton"):
                ours = entry.run_helion(inputs)
                theirs = entry.run_baseline(inputs)
            for key, value in theirs.items():
                assert ours[key].dtype == value.dtype, (key, ours[key].dtype, value.dtype)
            close(ours, {k: v.double() for k, v in theirs.items()}, atol=1e-4, rtol=1e-4)
    finally:
        reset_dispatch(modules)


def assert_gpu_matches_mamba_ssm(name: str, shape_name: str) -> None:
    """bf16 on the GPU against mamba-ssm's kernel, by the bench's criterion."""
    entry = registry.get(name)
    inputs = entry.inputs(suites.load().shape(shape_name), 0, "cuda")
    ours = entry.run_helion(inputs)
    theirs = entry.run_baseline(inputs)
    for key, ref in theirs.items():
        assert ours[key].dtype == ref.dtype, key
        atol, rtol = entry.tolerance(key)
        err = (ours[key].float() - ref.float()).abs()
        bound = scaled_atol(ref, atol) + rtol * ref.float().abs()
        assert bool((err <= bound).all()), (key, err.max().item())


def spy_states_dtypes(monkeypatch) -> dict:
    """Spies on the whole call's stages that read the inter-chunk states (``state_dtype``): the dtype each got,
    forward (``bmm_chunk_scan_fwd``, which the chained forward looks up in ``fused_paths``) and backward
    (``chunk_bwd_db_dc``)."""
    from mamba2_kernels.ssd import combined, fused_paths

    got = {}
    for owner, stage, where in ((fused_paths, "bmm_chunk_scan_fwd", 5), (combined.HELION_STAGES, "chunk_bwd_db_dc", 6)):
        real = getattr(owner, stage)

        def spy(*args, _real=real, _stage=stage, _where=where, **kwargs):
            got[_stage] = args[_where].dtype
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, stage, spy)
    return got
