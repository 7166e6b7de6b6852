"""Device time of each kernel a call launches, from PyTorch's profiler (CUDA activity only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def device_events(fn: Callable[[], Any], calls: int, warmup: int = 3) -> list[tuple[str, float]]:
    """(kernel name, device microseconds) of every kernel ``calls`` calls of ``fn`` launch, after ``warmup``
    calls outside the profile (compiles, autotuning and allocations stay out of it)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [(event.name, event.device_time_total) for event in prof.events()
            if event.device_type == torch.autograd.DeviceType.CUDA]
