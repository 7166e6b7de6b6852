"""The gated RMSNorm, forward and backward (M = batch x seqlen rows of d_ssm, groups of norm_group_size)."""

from __future__ import annotations

from mamba2_kernels import _mamba_ssm as mamba_ssm
from mamba2_kernels.registry.entry import KernelEntry
from mamba2_kernels.registry.inputs import inputs_norm
from mamba2_kernels.registry.models import norm_bytes

ENTRIES: tuple[KernelEntry, ...] = (
    KernelEntry(
        name="gated_rmsnorm_fwd", family="norm", phase="norm_fwd", replaces="_layer_norm_fwd_1pass_kernel",
        make_inputs=inputs_norm,
        args=("x", "weight", "bias", "eps", "z", "none", "group_size", "norm_before_gate", "true"),
        outputs=("out", "mean", "rstd"), reference="mamba2_kernels.norm.naive:gated_rmsnorm_fwd",
        baseline=f"{mamba_ssm.LAYERNORM_GATED}:_layer_norm_fwd", bytes_moved=norm_bytes(3),
        flops=lambda s: 8 * s.batch * s.seqlen * s.d_ssm,
        helion="mamba2_kernels.norm.gated_rmsnorm:gated_rmsnorm_fwd"),
    KernelEntry(
        name="gated_rmsnorm_bwd", family="norm", phase="norm_bwd", replaces="_layer_norm_bwd_kernel",
        make_inputs=inputs_norm,
        args=("dy", "x", "weight", "bias", "eps", "mean", "rstd", "z", "group_size", "norm_before_gate", "true"),
        outputs=("dx", "dw", "db", "dz"), reference="mamba2_kernels.norm.naive:gated_rmsnorm_bwd",
        baseline=f"{mamba_ssm.LAYERNORM_GATED}:_layer_norm_bwd", bytes_moved=norm_bytes(5),
        flops=lambda s: 20 * s.batch * s.seqlen * s.d_ssm,
        helion="mamba2_kernels.norm.gated_rmsnorm:gated_rmsnorm_bwd"),
)
