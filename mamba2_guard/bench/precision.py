"""Precision of one kernel call: Helion against mamba-ssm and both against the fp64 reference.

``max_rel_err_vs_fp64`` is max|out - ref| / max|ref| over an output: relative to the output's scale,
so that elements near zero do not turn rounding noise into huge ratios. For the same reason the allclose
criterion |ours - mamba-ssm| <= atol' + rtol |mamba-ssm| scales the absolute floor with the output:
atol' = atol * max(1, rms(mamba-ssm)) (as Helion's autotuner does). Outputs of order one (every user-facing
gradient here) keep atol as given; large fp32 reductions (a per-chunk ddt summing thousands of products)
are held to the same tolerance relative to their size.

A bf16/fp16 output may miss that criterion at a few strays (at most one element per million): where two
accumulation orders land on different sides of a rounding, and a later step (the layer's RMSNorm divides by
a group's rms) scales that ulp up. It still agrees with mamba-ssm when each stray is within mamba-ssm's own
worst error against fp64; their number is recorded either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from mamba2_kernels.tuning import scaled_atol

STRAYS_PER_ELEMENT = 1e-6


@dataclass(frozen=True)
class OutputPrecision:
    output: str
    max_abs_diff_vs_mamba_ssm: float | None
    mean_abs_diff_vs_mamba_ssm: float | None
    max_rel_err_vs_fp64: float
    mamba_ssm_max_rel_err_vs_fp64: float | None
    allclose: bool
    finite: bool
    # Elements beyond the tolerance of mamba-ssm's value (or of fp64's, without mamba-ssm).
    strays: int = 0
    # Without mamba-ssm (e.g. the layer without causal-conv1d): the fp64 error of the PyTorch reference run
    # in the inputs' own low-precision dtype, the yardstick of mamba-ssm's own tests.
    same_dtype_reference_max_rel_err_vs_fp64: float | None = None

    @property
    def ok(self) -> bool:
        """Finite, and: with mamba-ssm, allclose to it and at most twice its fp64 error; without it,
        allclose to fp64 or at most twice the fp64 error of PyTorch in the same dtype."""
        if not self.finite:
            return False
        peer_err = self.mamba_ssm_max_rel_err_vs_fp64
        if peer_err is not None:
            return self.allclose and self.max_rel_err_vs_fp64 <= 2 * peer_err + 1e-6
        same_err = self.same_dtype_reference_max_rel_err_vs_fp64
        return self.allclose or (same_err is not None and self.max_rel_err_vs_fp64 <= 2 * same_err + 1e-6)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    err = (out.double() - ref.double()).abs().max().item()
    return err / scale if scale > 0 else err


def compare_output(name: str, ours: torch.Tensor, ref64: torch.Tensor, peer: torch.Tensor | None,
                   atol: float, rtol: float, same_dtype: torch.Tensor | None = None) -> OutputPrecision:
    finite = bool(torch.isfinite(ours).all().item())
    ours64, ref64 = ours.double(), ref64.double().to(ours.device)
    against = peer.double().to(ours.device) if peer is not None else ref64
    diff = (ours64 - against).abs()
    beyond = ~(diff <= scaled_atol(against, atol) + rtol * against.abs())
    strays = int(beyond.sum().item())
    allclose = finite and strays == 0
    if (finite and peer is not None and 0 < strays <= STRAYS_PER_ELEMENT * ours.numel()
            and ours.dtype in (torch.bfloat16, torch.float16)):
        peer_worst = (against - ref64).abs().max()
        allclose = bool(((ours64 - ref64).abs()[beyond] <= peer_worst).all().item())
    return OutputPrecision(
        output=name,
        max_abs_diff_vs_mamba_ssm=diff.max().item() if peer is not None else None,
        mean_abs_diff_vs_mamba_ssm=diff.mean().item() if peer is not None else None,
        max_rel_err_vs_fp64=rel_err(ours64, ref64),
        mamba_ssm_max_rel_err_vs_fp64=rel_err(peer, ref64) if peer is not None else None,
        allclose=allclose,
        finite=finite,
        strays=strays,
        same_dtype_reference_max_rel_err_vs_fp64=(rel_err(same_dtype, ref64) if peer is None and same_dtype is not None
                                                  else None),
    )


def compare(ours: dict[str, torch.Tensor], ref64: dict[str, torch.Tensor],
            peer: dict[str, torch.Tensor] | None, tolerance,
            same_dtype: dict[str, torch.Tensor] | None = None) -> list[OutputPrecision]:
    """One ``OutputPrecision`` per output that both ours and the reference produce."""
    missing = sorted(set(ref64) - set(ours))
    if missing:
        raise ValueError(f"outputs missing from the implementation under test: {missing}")
    return [
        compare_output(name, ours[name], ref64[name], (peer or {}).get(name), *tolerance(name),
                       same_dtype=(same_dtype or {}).get(name))
        for name in ref64
    ]


def low_precision(outputs: dict[str, torch.Tensor]) -> bool:
    return any(t.dtype in (torch.bfloat16, torch.float16) for t in outputs.values())


def failing_outputs(outputs: Sequence[Mapping[str, Any]]) -> str:
    """One line naming each output (``OutputPrecision.to_dict()``) that failed, and by how much."""
    def num(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3g}"

    def yardstick(o: Mapping[str, Any]) -> str:
        if o["mamba_ssm_max_rel_err_vs_fp64"] is None and o.get("same_dtype_reference_max_rel_err_vs_fp64"):
            return f"PyTorch in the same dtype {num(o['same_dtype_reference_max_rel_err_vs_fp64'])}"
        return f"mamba-ssm {num(o['mamba_ssm_max_rel_err_vs_fp64'])}"

    return "; ".join(
        f"{o['output']}: max|ours - mamba-ssm| {num(o['max_abs_diff_vs_mamba_ssm'])}, allclose {o['allclose']} "
        f"({o.get('strays', 0)} beyond tolerance), "
        f"finite {o['finite']}, rel err vs fp64 {num(o['max_rel_err_vs_fp64'])} ({yardstick(o)})"
        for o in outputs if not o["ok"])
