"""Device timing: several implementations interleaved in rounds, in one process, L2 cleared before
every timed call, CUDA events around the call alone.

Interleaving puts Helion and mamba-ssm under the same clocks and thermal state, so their per-round ratio
cancels most machine noise (``../shared/notes/h200-measurements.md``). The order inside a round
alternates (ABBA) so that neither implementation always runs right after the other's L2 flush.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # > 4x the H200's 60 MiB L2, as triton.testing.do_bench uses


class Timer:
    def __init__(self, device: torch.device | str = "cuda"):
        self.device = torch.device(device)
        self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)

    def flush_l2(self) -> None:
        self._flush.zero_()

    def interleaved(self, fns: dict[str, Callable[[], Any]], *, rounds: int = 30, warmup: int = 3,
                    calls_per_sample: int = 1) -> dict[str, list[float]]:
        """Per-call milliseconds: ``rounds`` samples of each function, paired by round."""
        if rounds < 1 or warmup < 0 or calls_per_sample < 1:
            raise ValueError(f"rounds >= 1, warmup >= 0, calls_per_sample >= 1; got {rounds}, {warmup}, "
                             f"{calls_per_sample}")
        names = list(fns)
        for _ in range(warmup):
            for name in names:
                fns[name]()
        torch.cuda.synchronize(self.device)
        events = {name: [] for name in names}
        for round_index in range(rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.flush_l2()
                start.record()
                for _ in range(calls_per_sample):
                    fns[name]()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize(self.device)
        return {name: [s.elapsed_time(e) / calls_per_sample for s, e in pairs] for name, pairs in events.items()}


def copy_bandwidth(device: torch.device | str = "cuda", nbytes: int = 4 << 30, rounds: int = 10) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write counted), median of rounds."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    samples = Timer(device).interleaved({"copy": lambda: dst.copy_(src)}, rounds=rounds, warmup=2)["copy"]
    return 2 * src.numel() / (sorted(samples)[len(samples) // 2] / 1e3)


def bf16_matmul_flops(device: torch.device | str = "cuda", n: int = 8192, rounds: int = 10) -> float:
    """Measured dense bf16 matmul rate in FLOP/s, median of rounds."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    samples = Timer(device).interleaved({"mm": lambda: a @ b}, rounds=rounds, warmup=2)["mm"]
    return 2 * n ** 3 / (sorted(samples)[len(samples) // 2] / 1e3)
