"""Precision of one kernel call: Helion against mamba-ssm and both against the fp64 reference.

``max_rel_err_vs_fp64`` is max|out - ref| / max|ref| over an output: relative to the output's scale,
so that elements near zero do not turn rounding noise into huge ratios. For the same reason the allclose
criterion |ours - mamba-ssm| <= atol' + rtol |mamba-ssm| scales the absolute floor with the output:
atol' = atol * max(1, rms(mamba-ssm)) (as Helion's autotuner does). Outputs of order one (every user-facing
gradient here) keep atol as given; large fp32 reductions (a per-chunk ddt summing thousands of products)
are held to the same tolerance relative to their size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kernels._runtime import scaled_atol


@dataclass(frozen=True)
class OutputPrecision:
    output: str
    max_abs_diff_vs_mamba_ssm: float | None
    mean_abs_diff_vs_mamba_ssm: float | None
    max_rel_err_vs_fp64: float
    mamba_ssm_max_rel_err_vs_fp64: float | None
    allclose: bool
    finite: bool

    @property
    def ok(self) -> bool:
        """allclose to mamba-ssm (or to fp64 without it), finite, and at most twice mamba-ssm's fp64 error."""
        within_peer = (self.mamba_ssm_max_rel_err_vs_fp64 is None
                       or self.max_rel_err_vs_fp64 <= 2 * self.mamba_ssm_max_rel_err_vs_fp64 + 1e-6)
        return self.allclose and self.finite and within_peer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    err = (out.double() - ref.double()).abs().max().item()
    return err / scale if scale > 0 else err


def compare_output(name: str, ours: torch.Tensor, ref64: torch.Tensor, peer: torch.Tensor | None,
                   atol: float, rtol: float) -> OutputPrecision:
    finite = bool(torch.isfinite(ours).all().item())
    ours64, ref64 = ours.double(), ref64.double().to(ours.device)
    against = peer.double().to(ours.device) if peer is not None else ref64
    diff = (ours64 - against).abs()
    allclose = finite and bool((diff <= scaled_atol(against, atol) + rtol * against.abs()).all().item())
    return OutputPrecision(
        output=name,
        max_abs_diff_vs_mamba_ssm=diff.max().item() if peer is not None else None,
        mean_abs_diff_vs_mamba_ssm=diff.mean().item() if peer is not None else None,
        max_rel_err_vs_fp64=rel_err(ours64, ref64),
        mamba_ssm_max_rel_err_vs_fp64=rel_err(peer, ref64) if peer is not None else None,
        allclose=allclose,
        finite=finite,
    )


def compare(ours: dict[str, torch.Tensor], ref64: dict[str, torch.Tensor],
            peer: dict[str, torch.Tensor] | None, tolerance) -> list[OutputPrecision]:
    """One ``OutputPrecision`` per output that both ours and the reference produce."""
    missing = sorted(set(ref64) - set(ours))
    if missing:
        raise ValueError(f"outputs missing from the implementation under test: {missing}")
    return [
        compare_output(name, ours[name], ref64[name], (peer or {}).get(name), *tolerance(name))
        for name in ref64
    ]


def failing_outputs(outputs: Sequence[Mapping[str, Any]]) -> str:
    """One line naming each output (``OutputPrecision.to_dict()``) that failed, and by how much."""
    def num(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3g}"

    return "; ".join(
        f"{o['output']}: max|ours - mamba-ssm| {num(o['max_abs_diff_vs_mamba_ssm'])}, allclose {o['allclose']}, "
        f"finite {o['finite']}, rel err vs fp64 {num(o['max_rel_err_vs_fp64'])} "
        f"(mamba-ssm {num(o['mamba_ssm_max_rel_err_vs_fp64'])})"
        for o in outputs if not o["ok"])
