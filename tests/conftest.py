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
    from kernels.testing import enable_cpu_interpret

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
    from kernels import config_store

    yield
    config_store.INVALID.clear()


@pytest.fixture
def smoke_shape():
    from kernels import suites

    return suites.load().shape("smoke")
