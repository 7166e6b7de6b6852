"""Test set-up: CPU interpret mode without a GPU, and the ``gpu`` marker.

Tests marked ``@pytest.mark.gpu`` run only where CUDA is available (``pytest -m gpu`` on a GPU runner)
and are skipped cleanly elsewhere.
"""

from __future__ import annotations

import os

import pytest
import torch

# Tests that name a GPU slug must not record fallbacks into the user's state dir (tests/kernels/foundation/
# test_seen.py points the file at a temp dir).
os.environ["MAMBA2_GUARD_SEEN"] = "off"

if not torch.cuda.is_available():
    # Must run before mamba-ssm's Triton modules are imported (they are jit-decorated at import).
    from mamba2_kernels.testing import enable_cpu_interpret

    enable_cpu_interpret()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on a GPU runner)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _forget_rejected_configs():
    """Configs rejected during one test are drift for that test only (the record is process-wide)."""
    from mamba2_kernels import config_store

    yield
    config_store.INVALID.clear()


@pytest.fixture(autouse=True)
def _recording_as_a_training_job():
    """Each test starts as a training job would: the guard's CLI, run in-process by a test, stops the seen-keys
    recording for the rest of its process (``mamba2_kernels.seen.stop_recording``)."""
    from mamba2_kernels import seen

    os.environ.pop(seen.RECORD_ENV, None)
    yield
    os.environ.pop(seen.RECORD_ENV, None)


@pytest.fixture
def helion_bindings(monkeypatch):
    """One entry per kernel bound to a shape from here on: each binding runs Helion's front end, seconds of host
    time, so the tests that count them keep the runtime and the tools from binding more than they need."""
    from helion.runtime.kernel import BoundKernel

    bindings = []
    init = BoundKernel.__init__
    monkeypatch.setattr(BoundKernel, "__init__", lambda bound, *a, **k: bindings.append(1) or init(bound, *a, **k))
    return bindings


@pytest.fixture
def smoke_shape():
    from mamba2_kernels import suites

    return suites.load().shape("smoke")


# A public call as mamba2_kernels/seen.py records it, and entries of a seen-keys file in a temp state dir.
SEEN_CALL = {"batch": 1, "seqlen": 96, "nheads": 4, "headdim": 16, "ngroups": 2, "dstate": 16, "chunk_size": 32,
             "dtype": "float32", "call": {"z": True, "docs": 2, "D": "h", "initial_states": False}}


@pytest.fixture
def seen_file(tmp_path, monkeypatch):
    """The seen-keys file, in a temp dir, with configs read from a temp config dir."""
    from mamba2_kernels import config_store

    file = tmp_path / "seen.json"
    monkeypatch.setenv("MAMBA2_GUARD_SEEN", str(file))
    monkeypatch.setattr(config_store, "CONFIG_DIR", tmp_path / "configs")
    config_store.forget()
    return file


@pytest.fixture
def write_seen(seen_file):
    """Write entries ``(gpu, kernel, key)`` or ``(gpu, kernel, key, call)`` into the seen-keys file."""
    import json

    def write(*entries: tuple) -> None:
        seen_file.write_text(json.dumps({f"{gpu}|{kernel}|{key}": {
            "gpu": gpu, "kernel": kernel, "key": key, "reason": "related", "call": call[0] if call else SEEN_CALL}
            for gpu, kernel, key, *call in entries}))

    return write
