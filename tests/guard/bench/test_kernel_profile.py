"""``mamba2_guard.bench.kernel_profile`` on a GPU: the profiled calls' kernels, and none of the warm-up's."""

from __future__ import annotations

import pytest
import torch

from mamba2_guard.bench.kernel_profile import device_events
from mamba2_guard.core.kernel_time_table import per_call


@pytest.mark.gpu
def test_each_profiled_call_launches_the_kernels_it_runs():
    a = torch.randn(1024, 1024, device="cuda")
    rows = per_call(device_events(lambda: (a @ a).relu_(), calls=2, warmup=4), calls=2)
    # A matmul and an elementwise op: each kernel once per call (warm-up launches leaked in would count 3).
    assert sum(row.launches for row in rows) >= 2 and all(row.launches == 1 and row.ms > 0 for row in rows)
