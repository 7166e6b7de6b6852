"""Runs registry entries on a device (or the CPU interpreter) and checks their precision."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from guard.bench.precision import OutputPrecision, compare
from kernels.registry import BaselineUnavailable, KernelEntry, MissingImplementation
from kernels.suites import ShapeSpec


@dataclass
class PrecisionCase:
    kernel: str
    shape: str
    phase: str
    seed: int
    status: str  # "ok" | "precision-fail" | "missing-kernel" | "error"
    outputs: list[OutputPrecision] = field(default_factory=list)
    baseline: str | None = None  # why the peer (mamba-ssm) was not compared, if it was not
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "shape": self.shape, "phase": self.phase, "seed": self.seed,
            "status": self.status, "baseline": self.baseline, "error": self.error,
            "outputs": [o.to_dict() for o in self.outputs],
        }


def _short_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)[-1:]
    where = f" at {frames[0].filename}:{frames[0].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def precision_case(entry: KernelEntry, shape: ShapeSpec, seed: int, device: torch.device | str) -> PrecisionCase:
    case = PrecisionCase(entry.name, shape.name, entry.phase, seed, status="ok")
    if not entry.has_helion:
        case.status = "missing-kernel"
        return case
    try:
        inputs = entry.inputs(shape, seed, device)
        ours = entry.run_helion(inputs)
        ref64 = entry.run_reference(inputs)
        try:
            peer = entry.run_baseline(inputs)
        except BaselineUnavailable as exc:
            peer, case.baseline = None, str(exc)
        case.outputs = compare(ours, ref64, peer, entry.tolerance)
    except MissingImplementation:
        case.status = "missing-kernel"
        return case
    except Exception as exc:  # one failing kernel must not stop the suite
        case.status, case.error = "error", _short_error(exc)
        return case
    if not all(o.ok for o in case.outputs):
        case.status = "precision-fail"
    return case
