"""Fingerprint, the mamba-ssm loader, and installing beside Hugging Face's `kernels`."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from mamba2_guard.adapters import fingerprint
from mamba2_kernels import _mamba_ssm


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_fingerprint_on_cpu_has_null_gpu_fields():
    fp = fingerprint.collect()
    assert fp.gpu_name is None and fp.driver_version is None and fp.sm_count is None
    assert fp.torch == torch.__version__ and fp.helion and fp.triton and fp.mamba_ssm.startswith("2.3.")
    assert fp.kernels_source_hash == fingerprint.combined_hash(fp.kernel_sources)
    assert "registry/ssd.py" in fp.kernel_sources and "configs" not in "".join(fp.kernel_sources)
    assert fingerprint.gpu_slug(fp) == "cpu"
    assert fp.digest() == fingerprint.collect().digest()


def test_digest_ignores_host_but_not_versions():
    fp = fingerprint.collect()
    moved = fp.__class__(**{**fp.to_dict(), "hostname": "elsewhere", "gpu_uuid": "GPU-x"})
    upgraded = fp.__class__(**{**fp.to_dict(), "triton": "9.9.9"})
    assert moved.digest() == fp.digest()
    assert upgraded.digest() != fp.digest()


def test_kernel_source_hash_follows_the_sources(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = fingerprint.kernel_source_hashes(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert fingerprint.kernel_source_hashes(tmp_path) != first


@pytest.mark.gpu
def test_fingerprint_on_gpu_has_driver_and_uuid():
    fp = fingerprint.collect()
    assert fp.gpu_name and fp.driver_version and fp.sm_count > 0 and fp.gpu_uuid.startswith("GPU-")


def test_loader_imports_wrappers_and_references_without_cuda_extension():
    combined = _mamba_ssm.module(_mamba_ssm.SSD_COMBINED)
    assert callable(combined.mamba_chunk_scan_combined)
    assert callable(_mamba_ssm.resolve(f"{_mamba_ssm.SSD_MINIMAL}:ssd_minimal_discrete"))
    assert callable(_mamba_ssm.resolve(f"{_mamba_ssm.LAYERNORM_GATED}:rms_norm_ref"))
    with pytest.raises(ValueError, match="module:attribute"):
        _mamba_ssm.resolve("ops.triton.ssd_bmm")


def test_loader_keeps_mamba_ssm_autotune_picks_in_the_disk_cache(monkeypatch):
    from triton import knobs

    _mamba_ssm.module(_mamba_ssm.SSD_CHUNK_SCAN)
    tuners = _mamba_ssm._autotuners()
    assert "ops.triton.ssd_chunk_scan:_chunk_scan_fwd_kernel" in tuners
    for tuner in tuners.values():
        monkeypatch.setattr(tuner, "cache_results", False)
    _mamba_ssm.keep_autotune_picks()  # the interpreter (these tests) has no disk cache: left off
    assert not any(t.cache_results for t in tuners.values())
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    _mamba_ssm.keep_autotune_picks()
    assert all(t.cache_results for t in tuners.values())


def test_loaded_modules_come_back_without_setting_up_again(monkeypatch):
    """Timed baselines (the chained ones of the fused entries) resolve mamba-ssm's wrappers on every call: a
    module already imported must come back without its autotuners being set up again (0.45 ms of host time
    each, which the timer counted: 5.6 ms for a 0.27 ms pair on the H200)."""
    first = _mamba_ssm.module(_mamba_ssm.SSD_STATE_PASSING)
    _mamba_ssm._stages()  # imports the other stage modules too, whichever tests ran before this one
    setups = []
    monkeypatch.setattr(_mamba_ssm, "keep_autotune_picks", lambda: setups.append(1))
    assert _mamba_ssm.module(_mamba_ssm.SSD_STATE_PASSING) is first
    _mamba_ssm._stages()  # what the chained baselines resolve on every call
    assert setups == []
    # A first import is set up.
    fresh = types.ModuleType("fresh")
    monkeypatch.delitem(sys.modules, f"mamba_ssm.{_mamba_ssm.SSD_STATE_PASSING}")
    monkeypatch.setattr(_mamba_ssm.importlib, "import_module", lambda name: fresh)
    assert _mamba_ssm.module(_mamba_ssm.SSD_STATE_PASSING) is fresh
    assert setups == [1]


def test_last_picks_name_the_mamba_ssm_kernels_called_since_forget():
    bmm = _mamba_ssm.resolve(f"{_mamba_ssm.SSD_BMM}:_bmm_chunk_fwd")
    _mamba_ssm.module(_mamba_ssm.SSD_CHUNK_SCAN)
    _mamba_ssm.forget_last_picks()
    assert _mamba_ssm.last_picks() == {}
    a = torch.randn(1, 64, 1, 16)
    bmm(a, a, chunk_size=32)
    picks = _mamba_ssm.last_picks()
    assert list(picks) == ["ops.triton.ssd_bmm:_bmm_chunk_fwd_kernel"]
    assert "BLOCK_SIZE_M" in picks["ops.triton.ssd_bmm:_bmm_chunk_fwd_kernel"]


def test_loader_says_clearly_when_mamba_ssm_is_absent(monkeypatch):
    monkeypatch.delitem(sys.modules, "mamba_ssm", raising=False)
    monkeypatch.setattr(_mamba_ssm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(_mamba_ssm.MambaSsmUnavailable, match="mamba-ssm is not installed.*scripts/install.sh"):
        _mamba_ssm.module(_mamba_ssm.SSD_COMBINED)


def test_installs_beside_hugging_faces_kernels_package():
    """transformers 5 depends on Hugging Face's `kernels` distribution, whose import name is `kernels`: this
    project once used that name too, and pip merged both into one folder, so whichever was installed last
    broke the other (transformers' hub_kernels, or the drop-ins). The dev extra installs both."""
    from importlib.metadata import distribution

    import kernels as hugging_face_kernels
    import transformers.integrations.hub_kernels  # noqa: F401  imports names from Hugging Face's `kernels`

    import mamba2_kernels

    assert callable(hugging_face_kernels.get_kernel)
    assert callable(mamba2_kernels.mamba_chunk_scan_combined) and callable(mamba2_kernels.patch_mamba_ssm)
    top_level = {Path(str(f)).parts[0] for f in distribution("kernels").files or []}
    assert "kernels" in top_level and not top_level & {"mamba2_kernels", "mamba2_guard"}
