"""Device timing: several implementations interleaved in rounds, in one process, L2 cleared before
every timed call, CUDA events around the call alone.

Interleaving puts Helion and mamba-ssm under the same clocks and thermal state, so their per-round ratio
cancels most machine noise (``../shared/notes/h200-measurements.md``). The order inside a round
alternates (ABBA) so that neither implementation always runs right after the other's L2 flush.

Two things keep the host out of the device times. Warm-up lasts a minimum time as well as a minimum
number of rounds, as ``triton.testing.do_bench``'s does (3 rounds of a 10 us kernel are no warm-up). Before
each timed call a short GPU sleep gives the host a head start: without it, a call whose Python dispatch
takes longer than the L2 flush leaves the GPU idle after the start event, and the sample measures the host
(on the H200 a 10 us kernel read as the ~0.1 ms of its dispatch, and 12.6 % of whole-suite A/A verdicts
were false regressions; ``docs/statistics.md``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from mamba2_guard.core.fingerprint_hash import TIMING_METHOD

L2_FLUSH_BYTES = 256 * 1024 * 1024  # > 4x the H200's 60 MiB L2, as triton.testing.do_bench uses
WARMUP_MS = 25.0  # as triton.testing.do_bench's default warm-up
HEAD_START_MS = 0.5  # longer than a kernel call's Python dispatch (~0.1 ms for Helion's and mamba-ssm's here)
MAX_WARMUP_ROUNDS = 1000
# Bumped (in mamba2_guard.core.fingerprint_hash) when a change to the timing moves the numbers: a baseline taken
# by another method is not compared with, and the history window starts again.
METHOD_VERSION = TIMING_METHOD


def method(graphs: bool) -> str:
    """A case's timing method, as recorded in its result and baseline."""
    return f"{'cuda-graph' if graphs else 'eager'}/{METHOD_VERSION}"


def measured_under(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A result's fingerprint: the environment's plus the timing method, so that history resets with it."""
    return {**fingerprint, "timing_method": METHOD_VERSION}


def sleep_cycles_per_ms(device: torch.device | str = "cuda") -> float:
    """How many ``torch.cuda._sleep`` cycles take one millisecond on this GPU (median of 10)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles, times = 2_000_000, []
    with torch.cuda.device(device):
        for _ in range(10):
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return cycles / statistics.median(times)


class Timer:
    def __init__(self, device: torch.device | str = "cuda", warmup_ms: float = WARMUP_MS,
                 head_start_ms: float = HEAD_START_MS):
        self.device = torch.device(device)
        self.warmup_ms = warmup_ms
        self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)
        # torch.cuda._sleep is private (PyTorch's own tests use it): without it, no head start
        can_sleep = head_start_ms > 0 and hasattr(torch.cuda, "_sleep")
        self._head_start_cycles = int(head_start_ms * sleep_cycles_per_ms(self.device)) if can_sleep else 0

    def flush_l2(self) -> None:
        self._flush.zero_()

    def interleaved(self, fns: dict[str, Callable[[], Any]], *, rounds: int = 30, warmup: int = 3,
                    calls_per_sample: int = 1) -> dict[str, list[float]]:
        """Per-call milliseconds: ``rounds`` samples of each function, paired by round."""
        _check_counts(rounds, warmup, calls_per_sample)
        self._warm_up(fns, warmup)
        return self._rounds(fns, rounds, calls_per_sample)

    def _warm_up(self, fns: dict[str, Callable[[], Any]], warmup: int) -> None:
        """At least ``warmup`` rounds and ``warmup_ms`` of wall time, each round as a timed one."""
        started, done = time.perf_counter(), 0
        while done < warmup or (time.perf_counter() - started) * 1e3 < self.warmup_ms:
            for fn in fns.values():
                self.flush_l2()
                fn()
            torch.cuda.synchronize(self.device)
            done += 1
            if done >= MAX_WARMUP_ROUNDS:
                break

    def interleaved_graphs(self, fns: dict[str, Callable[[], Any]], *, rounds: int = 30, warmup: int = 3,
                           calls_per_sample: int = 1) -> dict[str, list[float]]:
        """As ``interleaved``, each function captured once as a CUDA graph and timed as graph replays.

        A replay has no Python, launcher or autograd overhead, so a composite call (many launches, a
        forward and backward through autograd) is timed by its device work alone. L2 is still flushed
        before every replay, outside the graph; the capture is warmed up on a side stream first, as
        graph capture requires."""
        _check_counts(rounds, warmup, calls_per_sample)
        # A tuner's search before the timing can leave the allocator's cache holding the whole card; the side
        # stream is the driver's to allocate, outside that cache, and fails for want of memory then.
        torch.cuda.empty_cache()
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
        replays = {name: graph.replay for name, graph in graphs.items()}
        self._warm_up(replays, 0)
        return self._rounds(replays, rounds, calls_per_sample)

    def _rounds(self, fns: dict[str, Callable[[], Any]], rounds: int, calls_per_sample: int) -> dict[str, list[float]]:
        names = list(fns)
        events = {name: [] for name in names}
        for round_index in range(rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.flush_l2()
                if self._head_start_cycles:
                    torch.cuda._sleep(self._head_start_cycles)
                start.record()
                for _ in range(calls_per_sample):
                    fns[name]()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize(self.device)
        return {name: [s.elapsed_time(e) / calls_per_sample for s, e in pairs] for name, pairs in events.items()}


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What ``wall_interleaved`` waits on for ``device``: its CUDA stream's work, or nothing on a CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def wall_interleaved(fns: dict[str, Callable[[], Any]], *, rounds: int, steps: int, warmup: int = 3,
                     synchronize: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """Host-inclusive wall milliseconds per call, as an eager training loop sees them: each sample is
    ``steps`` calls back to back, synchronized (``synchronize``: the device's; none on a CPU) before and
    after the loop only, so the host's work per call (Python, autograd, config lookups, launches) counts
    where it outlasts the device's, and hides where it does not. No L2 flush, no head start, no graphs:
    consecutive steps do not have them either. Rounds alternate the order (ABBA) as ``Timer``'s do. Noisy
    (``../shared/notes/h200-measurements.md``: +-12 % in an A/A median): reported beside the device time,
    never alone."""
    _check_counts(rounds, warmup, steps, per_sample="steps")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    names, samples = list(fns), {name: [] for name in fns}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                fns[name]()
            synchronize()
            samples[name].append((time.perf_counter() - started) * 1e3 / steps)
    return samples


def _check_counts(rounds: int, warmup: int, calls_per_sample: int, per_sample: str = "calls_per_sample") -> None:
    """One line naming the counts, ``per_sample`` the caller's name for the calls of one sample."""
    if rounds < 1 or warmup < 0 or calls_per_sample < 1:
        raise ValueError(f"rounds: expected >= 1, warmup >= 0, {per_sample} >= 1; got {rounds}, {warmup}, "
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
