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
        _check_counts(rounds, warmup, calls_per_sample)
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        torch.cuda.synchronize(self.device)
        return self._rounds(fns, rounds, calls_per_sample)

    def interleaved_graphs(self, fns: dict[str, Callable[[], Any]], *, rounds: int = 30, warmup: int = 3,
                           calls_per_sample: int = 1) -> dict[str, list[float]]:
        """As ``interleaved``, each function captured once as a CUDA graph and timed as graph replays.

        A replay has no Python, launcher or autograd overhead, so a composite call (many launches, a
        forward and backward through autograd) is timed by its device work alone. L2 is still flushed
        before every replay, outside the graph; the capture is warmed up on a side stream first, as
        graph capture requires."""
        _check_counts(rounds, warmup, calls_per_sample)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        graphs = {}
        with torch.cuda.stream(side):
            for name, fn in fns.items():
                for _ in range(max(warmup, 1)):
                    fn()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    fn()
                graphs[name] = graph
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        return self._rounds({name: graph.replay for name, graph in graphs.items()}, rounds, calls_per_sample)

    def _rounds(self, fns: dict[str, Callable[[], Any]], rounds: int, calls_per_sample: int) -> dict[str, list[float]]:
        names = list(fns)
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


def _check_counts(rounds: int, warmup: int, calls_per_sample: int) -> None:
    if rounds < 1 or warmup < 0 or calls_per_sample < 1:
        raise ValueError(f"rounds: expected >= 1, warmup >= 0, calls_per_sample >= 1; got {rounds}, {warmup}, "
                         f"{calls_per_sample}")


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
