"""mamba2_kernels._environ: the environment's switches read once per public call."""

from __future__ import annotations

import collections
import threading
import types

import torch

import mamba2_kernels
from mamba2_kernels import _environ
from mamba2_kernels.testing import execution_mode


def test_inside_a_block_a_variables_first_read_holds_and_outside_every_read_is_fresh(monkeypatch):
    monkeypatch.setenv("MAMBA2_GUARD_TEST_SWITCH", "a")
    seen_by_other_thread = []
    with _environ.read_once():
        assert _environ.get("MAMBA2_GUARD_TEST_SWITCH") == "a"
        monkeypatch.setenv("MAMBA2_GUARD_TEST_SWITCH", "b")
        assert _environ.get("MAMBA2_GUARD_TEST_SWITCH") == "a"
        with _environ.read_once():  # an inner block joins the outer one
            assert _environ.get("MAMBA2_GUARD_TEST_SWITCH") == "a"
        assert _environ.get("MAMBA2_GUARD_TEST_UNSET") is None
        thread = threading.Thread(target=lambda: seen_by_other_thread.append(_environ.get("MAMBA2_GUARD_TEST_SWITCH")))
        thread.start()
        thread.join()
    assert seen_by_other_thread == ["b"]  # another thread reads afresh
    assert _environ.get("MAMBA2_GUARD_TEST_SWITCH") == "b"


def _reads_of(monkeypatch, call) -> collections.Counter:
    """How many times ``call()`` read each environment variable through ``_environ``."""
    reads = collections.Counter()

    class CountingEnviron(dict):
        def get(self, name, default=None):
            reads[name] += 1
            return super().get(name, default)

    with execution_mode("ref"):
        monkeypatch.setattr(_environ, "os", types.SimpleNamespace(environ=CountingEnviron(_environ.os.environ)))
        call()
    return reads


def test_an_ssd_call_reads_each_switch_once_forward_and_once_backward(monkeypatch):
    """The forward's and the backward's launches, rule checks and slug lookups read the same few variables;
    each is a public call (the backward runs in autograd's engine), and reads each at most once."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, 2, 8, generator=g, requires_grad=True)
    dt = torch.rand(1, 64, 2, generator=g)
    B, C = torch.randn(1, 64, 1, 8, generator=g), torch.randn(1, 64, 1, 8, generator=g)
    reads = _reads_of(monkeypatch, lambda: mamba2_kernels.mamba_chunk_scan_combined(
        x, dt, -torch.rand(2, generator=g), B, C, 32).sum().backward())
    assert reads and max(reads.values()) <= 2, reads


def test_a_layer_call_reads_each_switch_once_forward_and_once_backward(monkeypatch):
    from tests.kernels.layer.test_layer import _problem, _run

    leaves, static = _problem(options=("rmsnorm", "outproj"))
    reads = _reads_of(monkeypatch, lambda: _run(mamba2_kernels.mamba_split_conv1d_scan_combined, leaves, static,
                                                torch.float32))
    assert reads and max(reads.values()) <= 2, reads
