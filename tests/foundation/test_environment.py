"""Fingerprint, the mamba-ssm loader and the `kernels` import-name check."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import guard
from guard import fingerprint
from kernels import _mamba_ssm


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_fingerprint_on_cpu_has_null_gpu_fields():
    fp = fingerprint.collect()
    assert fp.gpu_name is None and fp.driver_version is None and fp.sm_count is None
    assert fp.torch == torch.__version__ and fp.helion and fp.triton and fp.mamba_ssm.startswith("2.3.")
    assert fp.kernels_source_hash == fingerprint.combined_hash(fp.kernel_sources)
    assert "registry.py" in fp.kernel_sources and "configs" not in "".join(fp.kernel_sources)
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


def test_loader_says_clearly_when_mamba_ssm_is_absent(monkeypatch):
    monkeypatch.delitem(sys.modules, "mamba_ssm", raising=False)
    monkeypatch.setattr(_mamba_ssm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(_mamba_ssm.MambaSsmUnavailable, match="mamba-ssm is not installed.*scripts/install.sh"):
        _mamba_ssm.module(_mamba_ssm.SSD_COMBINED)


def test_a_shadowing_kernels_package_is_refused(monkeypatch):
    impostor = types.ModuleType("kernels")
    impostor.__file__ = "/site-packages/kernels/__init__.py"
    monkeypatch.setitem(sys.modules, "kernels", impostor)
    with pytest.raises(guard.EnvironmentProblem, match="Hugging Face"):
        guard.check_kernels_package()


def test_this_kernels_package_is_accepted():
    guard.check_kernels_package()
