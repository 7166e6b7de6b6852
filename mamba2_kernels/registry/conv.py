"""The causal depthwise conv1d over x, B and C, forward and backward; the causal-conv1d package is the CUDA
baseline."""

from __future__ import annotations

from mamba2_kernels.registry.entry import KernelEntry
from mamba2_kernels.registry.inputs import inputs_conv
from mamba2_kernels.registry.models import conv_bytes

ENTRIES: tuple[KernelEntry, ...] = (
    KernelEntry(
        name="causal_conv1d_fwd", family="conv", phase="conv_fwd", replaces="causal_conv1d_fwd (CUDA, causal-conv1d)",
        make_inputs=inputs_conv, args=("x", "weight", "bias", "seq_idx=seq_idx", "activation=activation"),
        outputs=("out",), reference="mamba2_kernels.conv.naive:causal_conv1d_fwd",
        baseline="causal_conv1d:causal_conv1d_fn", bytes_moved=conv_bytes(2),
        flops=lambda s: 2 * s.batch * s.conv_dim * s.seqlen * s.conv_width, baseline_name="causal_conv1d",
        baseline_requires="causal_conv1d", helion="mamba2_kernels.conv.causal_conv1d:causal_conv1d_fwd"),
    KernelEntry(
        name="causal_conv1d_bwd", family="conv", phase="conv_bwd", replaces="causal_conv1d_bwd (CUDA, causal-conv1d)",
        make_inputs=inputs_conv, args=("x", "weight", "bias", "dout", "seq_idx", "activation"),
        outputs=("dx", "dweight", "dbias"), reference="mamba2_kernels.conv.naive:causal_conv1d_bwd",
        baseline="mamba2_kernels.conv.naive:causal_conv1d_cuda_bwd", bytes_moved=conv_bytes(3),
        flops=lambda s: 6 * s.batch * s.conv_dim * s.seqlen * s.conv_width, baseline_name="causal_conv1d",
        baseline_requires="causal_conv1d", helion="mamba2_kernels.conv.causal_conv1d:causal_conv1d_bwd"),
)
