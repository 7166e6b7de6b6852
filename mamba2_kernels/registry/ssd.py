"""The SSD's stages, forward then backward (the launch order of ``_mamba_chunk_scan_combined_bwd``), each
against mamba-ssm's kernel, or its pair of kernels where ours fuses two."""

from __future__ import annotations

from mamba2_kernels import _mamba_ssm as mamba_ssm
from mamba2_kernels.registry.entry import KernelEntry
from mamba2_kernels.registry.inputs import (
    inputs_bmm_chunk,
    inputs_bmm_chunk_bwd,
    inputs_bwd_with_states,
    inputs_chunk_cumsum,
    inputs_chunk_cumsum_bwd,
    inputs_chunk_cumsum_bwd_terms,
    inputs_chunk_scan,
    inputs_chunk_scan_bwd_dz,
    inputs_chunk_state,
    inputs_chunk_state_passing_bwd,
    inputs_chunk_state_varlen,
    inputs_db_dc,
    inputs_state_passing,
    inputs_state_passing_bwd,
)
from mamba2_kernels.registry.models import flops_of, traffic, varlen_bytes

REFERENCE = "mamba2_kernels.ssd.naive"
SCAN = mamba_ssm.SSD_CHUNK_SCAN
STATE = mamba_ssm.SSD_CHUNK_STATE
PASSING = mamba_ssm.SSD_STATE_PASSING
BMM = mamba_ssm.SSD_BMM
# chunk_cumsum then the state pass, on the call's dt with dt_bias and softplus; the out dtype follows.
CUMSUM_STATE_ARGS = ("dt_raw", "A", "B", "x", "chunk_size", "dt_bias", "true", "dt_limit", "none", "seq_idx")

ENTRIES: tuple[KernelEntry, ...] = (
    KernelEntry(
        name="chunk_cumsum", family="ssd", phase="fwd_1", replaces="_chunk_cumsum_fwd_kernel",
        make_inputs=inputs_chunk_cumsum, args=("dt_raw", "A", "chunk_size", "dt_bias", "dt_softplus", "dt_limit"),
        outputs=("dA_cumsum", "dt"), reference=f"{REFERENCE}:chunk_cumsum_fwd", baseline=f"{STATE}:_chunk_cumsum_fwd",
        bytes_moved=traffic(lambda z: z["dt_raw"] + 2 * z["dt"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 8 * b * L * h),
        helion="mamba2_kernels.ssd.chunk_cumsum:chunk_cumsum_fwd"),
    KernelEntry(
        name="chunk_state", family="ssd", phase="fwd_2", replaces="_chunk_state_fwd_kernel",
        make_inputs=inputs_chunk_state, args=("B", "x", "dt", "dA_cumsum", "seq_idx"), outputs=("states",),
        reference=f"{REFERENCE}:chunk_state_fwd", baseline=f"{STATE}:_chunk_state_fwd",
        bytes_moved=traffic(lambda z: z["bc"] + z["x"] + 2 * z["dt"] + z["states32"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.parity.chunk_state:chunk_state_fwd"),
    KernelEntry(
        name="state_passing", family="ssd", phase="fwd_3", replaces="_state_passing_fwd_kernel",
        make_inputs=inputs_state_passing,
        args=("states", "dA_chunk_cumsum", "none", "seq_idx", "chunk_size", "io_dtype"),
        outputs=("states", "final_states"), reference=f"{REFERENCE}:state_passing_fwd",
        baseline=f"{PASSING}:_state_passing_fwd",
        bytes_moved=traffic(lambda z: z["states32"] + z["states"] + z["final"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.parity.state_passing:state_passing_fwd"),
    KernelEntry(
        name="bmm_chunk", family="ssd", phase="fwd_4", replaces="_bmm_chunk_fwd_kernel", make_inputs=inputs_bmm_chunk,
        args=("C", "B", "chunk_size", "seq_idx", "false", "fp32"), outputs=("cb",),
        reference=f"{REFERENCE}:bmm_chunk_fwd", baseline=f"{BMM}:_bmm_chunk_fwd",
        bytes_moved=traffic(lambda z: 2 * z["bc"] + z["cb"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * c * G * Q * Q * n),
        helion="mamba2_kernels.ssd.bmm_chunk:bmm_chunk_fwd"),
    KernelEntry(
        name="chunk_scan", family="ssd", phase="fwd_5", replaces="_chunk_scan_fwd_kernel",
        make_inputs=inputs_chunk_scan, args=("cb", "x", "dt", "dA_cumsum", "C", "states", "D", "none", "seq_idx"),
        outputs=("out", "out_x"), reference=f"{REFERENCE}:chunk_scan_fwd", baseline=f"{SCAN}:_chunk_scan_fwd",
        bytes_moved=traffic(lambda z: z["cb"] + 2 * z["x"] + 2 * z["dt"] + z["bc"] + z["states"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p + 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.chunk_scan:chunk_scan_fwd"),
    # bmm_chunk and chunk_scan in one launch (the forward's fused path where a GPU's rule picks it), against
    # mamba-ssm's two kernels.
    KernelEntry(
        name="bmm_chunk_scan", family="ssd", phase="fwd_4_5", replaces="_bmm_chunk_fwd_kernel + _chunk_scan_fwd_kernel",
        make_inputs=inputs_chunk_scan, args=("x", "dt", "dA_cumsum", "B", "C", "states", "D", "none", "seq_idx"),
        outputs=("out", "out_x"), reference=f"{REFERENCE}:bmm_chunk_scan_fwd",
        baseline="mamba2_kernels._mamba_ssm:bmm_chunk_scan_fwd",
        bytes_moved=traffic(lambda z: 2 * z["x"] + 2 * z["dt"] + 2 * z["bc"] + z["states"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * (p + n) + 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.chunk_scan:bmm_chunk_scan_fwd"),
    # chunk_state then state_passing in one pass (our forward's form), against mamba-ssm's two kernels.
    KernelEntry(
        name="chunk_state_passing", family="ssd", phase="fwd_2_3",
        replaces="_chunk_state_fwd_kernel + _state_passing_fwd_kernel", make_inputs=inputs_chunk_state,
        args=("B", "x", "dt", "dA_cumsum", "none", "seq_idx", "io_dtype"), outputs=("states", "final_states"),
        reference=f"{REFERENCE}:chunk_state_passing_fwd", baseline="mamba2_kernels._mamba_ssm:chunk_state_passing_fwd",
        bytes_moved=traffic(lambda z: z["bc"] + z["x"] + 2 * z["dt"] + z["states"] + z["final"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n + 2 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.chunk_state_passing:chunk_state_passing_fwd"),
    # chunk_cumsum in that pass as well (the forward's fused path where a GPU's rule picks it), against
    # mamba-ssm's three kernels; and the same for the backward's recompute of the states in fp32.
    KernelEntry(
        name="chunk_cumsum_state_passing", family="ssd", phase="fwd_1_3",
        replaces="_chunk_cumsum_fwd_kernel + _chunk_state_fwd_kernel + _state_passing_fwd_kernel",
        make_inputs=inputs_chunk_cumsum, args=CUMSUM_STATE_ARGS + ("io_dtype",),
        outputs=("dA_cumsum", "dt", "states", "final_states"), reference=f"{REFERENCE}:chunk_cumsum_state_passing_fwd",
        baseline="mamba2_kernels._mamba_ssm:chunk_cumsum_state_passing_fwd",
        bytes_moved=traffic(lambda z: z["dt_raw"] + 2 * z["dt"] + z["bc"] + z["x"] + z["states"] + z["final"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 8 * b * L * h + 2 * b * L * h * p * n + 2 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.chunk_state_passing:chunk_cumsum_state_passing_fwd"),
    KernelEntry(
        name="chunk_cumsum_state_passing_fp32", family="ssd", phase="bwd_1_3",
        replaces="_chunk_cumsum_fwd_kernel + _chunk_state_fwd_kernel + _state_passing_fwd_kernel (backward "
                 "recompute, fp32 out)",
        make_inputs=inputs_chunk_cumsum, args=CUMSUM_STATE_ARGS, outputs=("dA_cumsum", "dt", "states", "final_states"),
        reference=f"{REFERENCE}:chunk_cumsum_state_passing_fwd",
        baseline="mamba2_kernels._mamba_ssm:chunk_cumsum_state_passing_fwd",
        bytes_moved=traffic(lambda z: z["dt_raw"] + 2 * z["dt"] + z["bc"] + z["x"] + z["states32"] + z["final"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 8 * b * L * h + 2 * b * L * h * p * n + 2 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.chunk_state_passing:chunk_cumsum_state_passing_fwd"),
    # The forward after chunk_cumsum in one launch (where a GPU's rule picks it), against mamba-ssm's four kernels:
    # x, B and C read once, no per-chunk states in memory.
    KernelEntry(
        name="ssd_fused_fwd", family="ssd", phase="fwd_2_5",
        replaces="_chunk_state_fwd_kernel + _state_passing_fwd_kernel + _bmm_chunk_fwd_kernel + _chunk_scan_fwd_kernel",
        make_inputs=inputs_chunk_state, args=("x", "dt", "dA_cumsum", "B", "C", "D", "none", "none", "seq_idx"),
        outputs=("out", "out_x", "final_states"), reference=f"{REFERENCE}:chunk_state_passing_scan_fwd",
        baseline="mamba2_kernels._mamba_ssm:chunk_state_passing_scan_fwd",
        bytes_moved=traffic(lambda z: 2 * z["dt"] + 2 * z["x"] + 2 * z["bc"] + z["final"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 4 * b * L * h * p * n + 2 * b * c * h * p * n
                       + b * c * h * Q * Q * (p + n)),
        helion="mamba2_kernels.ssd.ssd_fused_fwd:ssd_fused_fwd"),
    # The state at the end of each sequence of a packed input (return_varlen_states=True), after chunk_scan.
    KernelEntry(
        name="chunk_state_varlen", family="ssd", phase="fwd_6", replaces="_chunk_state_varlen_kernel",
        make_inputs=inputs_chunk_state_varlen, args=("B", "x", "dt", "dA_cumsum", "cu_seqlens", "chunk_states"),
        outputs=("varlen_states",), reference=f"{REFERENCE}:chunk_state_varlen",
        baseline=f"{STATE}:chunk_state_varlen", bytes_moved=varlen_bytes,
        flops=lambda s: 2 * (2 + s.batch * s.seqlen // 256) * s.chunk_size * s.nheads * s.headdim * s.dstate,
        helion="mamba2_kernels.ssd.chunk_state_varlen:chunk_state_varlen"),
    # The backward's recompute of the states (fp32 output, as mamba-ssm's backward computes them): the same
    # kernel under its own shape key, so that the bench watches it and the tuner gives it a whole job.
    KernelEntry(
        name="chunk_state_passing_fp32", family="ssd", phase="bwd_2_3",
        replaces="_chunk_state_fwd_kernel + _state_passing_fwd_kernel (backward recompute, fp32 out)",
        make_inputs=inputs_chunk_state, args=("B", "x", "dt", "dA_cumsum", "none", "seq_idx"),
        outputs=("states", "final_states"), reference=f"{REFERENCE}:chunk_state_passing_fwd",
        baseline="mamba2_kernels._mamba_ssm:chunk_state_passing_fwd",
        bytes_moved=traffic(lambda z: z["bc"] + z["x"] + 2 * z["dt"] + z["states32"] + z["final"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n + 2 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.chunk_state_passing:chunk_state_passing_fwd"),
    KernelEntry(
        name="chunk_scan_bwd_dz", family="ssd", phase="bwd_5", replaces="_chunk_scan_bwd_dz_kernel",
        make_inputs=inputs_chunk_scan_bwd_dz, args=("x", "z", "out_x", "dout", "chunk_size", "false", "D_per_dim"),
        outputs=("dz", "dout_x", "dD"), reference=f"{REFERENCE}:chunk_scan_bwd_dz",
        baseline=f"{SCAN}:_chunk_scan_bwd_dz", bytes_moved=traffic(lambda z: 6 * z["x"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 12 * b * L * h * p),
        helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dz"),
    KernelEntry(
        name="chunk_scan_bwd_dstates", family="ssd", phase="bwd_6", replaces="_chunk_scan_bwd_dstates_kernel",
        make_inputs=inputs_chunk_state, args=("C", "dA_cumsum", "dout", "seq_idx", "fp32"), outputs=("dstates",),
        reference=f"{REFERENCE}:chunk_scan_bwd_dstates", baseline=f"{SCAN}:_chunk_scan_bwd_dstates",
        bytes_moved=traffic(lambda z: z["bc"] + z["dt"] + z["x"] + z["states32"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.parity.chunk_scan_bwd_dstates:chunk_scan_bwd_dstates"),
    KernelEntry(
        name="state_passing_bwd", family="ssd", phase="bwd_7", replaces="_state_passing_bwd_kernel",
        make_inputs=inputs_state_passing_bwd,
        args=("states", "dA_chunk_cumsum", "dstates_flat", "none", "seq_idx", "false", "io_dtype", "io_dtype",
              "chunk_size"),
        outputs=("dstates", "ddA_chunk_cumsum", "dinitial_states", "states_converted"),
        reference=f"{REFERENCE}:state_passing_bwd", baseline=f"{PASSING}:_state_passing_bwd",
        bytes_moved=traffic(lambda z: 2 * z["states32"] + 2 * z["states"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 4 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.parity.state_passing_bwd:state_passing_bwd"),
    # dstates then state passing backward in one pass (our backward's form), against mamba-ssm's two kernels.
    KernelEntry(
        name="chunk_state_passing_bwd", family="ssd", phase="bwd_6_7",
        replaces="_chunk_scan_bwd_dstates_kernel + _state_passing_bwd_kernel",
        make_inputs=inputs_chunk_state_passing_bwd,
        args=("C", "dA_cumsum", "dout", "states_fp32", "none", "seq_idx", "false", "io_dtype", "io_dtype"),
        outputs=("dstates", "ddA_chunk_cumsum", "dinitial_states", "states_converted"),
        reference=f"{REFERENCE}:chunk_state_passing_bwd", baseline="mamba2_kernels._mamba_ssm:chunk_state_passing_bwd",
        bytes_moved=traffic(lambda z: z["bc"] + z["dt"] + z["x"] + z["states32"] + 2 * z["states"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n + 4 * b * c * h * p * n),
        helion="mamba2_kernels.ssd.chunk_state_passing_bwd:chunk_state_passing_bwd"),
    KernelEntry(
        name="chunk_scan_chunk_state_bwd_dx", family="ssd", phase="bwd_8",
        replaces="_chunk_scan_chunk_state_bwd_dx_kernel", make_inputs=inputs_bwd_with_states,
        args=("x", "dt", "dA_cumsum", "B", "cb", "dout", "dstates", "D", "seq_idx"), outputs=("dx", "ddt", "dD"),
        reference=f"{REFERENCE}:chunk_scan_chunk_state_bwd_dx",
        baseline=f"{mamba_ssm.SSD_COMBINED}:_chunk_scan_chunk_state_bwd_dx",
        bytes_moved=traffic(lambda z: 3 * z["x"] + 3 * z["dt"] + z["bc"] + z["cb"] + z["states"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p + 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.chunk_scan_chunk_state_bwd:chunk_scan_chunk_state_bwd_dx"),
    KernelEntry(
        name="chunk_state_bwd_db", family="ssd", phase="bwd_9", replaces="_chunk_state_bwd_db_kernel",
        make_inputs=inputs_bwd_with_states, args=("x", "dt", "dA_cumsum", "dstates", "seq_idx", "B", "ngroups"),
        outputs=("dB", "ddA_next"), reference=f"{REFERENCE}:chunk_state_bwd_db",
        baseline=f"{STATE}:_chunk_state_bwd_db",
        bytes_moved=traffic(lambda z: z["x"] + 3 * z["dt"] + z["states"] + z["bc"] + z["bc32"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.chunk_state_bwd:chunk_state_bwd_db"),
    KernelEntry(
        name="chunk_scan_bwd_dC", family="ssd", phase="bwd_10", replaces="_chunk_scan_bwd_dc_kernel",
        make_inputs=inputs_bwd_with_states, args=("prev_states", "dA_cumsum", "dout", "seq_idx", "C", "ngroups"),
        outputs=("dC", "ddA_cumsum_prev"), reference=f"{REFERENCE}:chunk_scan_bwd_dC",
        baseline=f"{SCAN}:_chunk_scan_bwd_dC",
        bytes_moved=traffic(lambda z: z["states"] + 2 * z["dt"] + z["x"] + z["bc"] + z["bc32"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
        helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dC"),
    KernelEntry(
        name="chunk_scan_bwd_dcb", family="ssd", phase="bwd_11", replaces="_chunk_scan_bwd_dcb_kernel",
        make_inputs=inputs_bwd_with_states, args=("x", "dt", "dA_cumsum", "dout", "seq_idx", "none", "ngroups"),
        outputs=("dcb",), reference=f"{REFERENCE}:chunk_scan_bwd_dcb", baseline=f"{SCAN}:_chunk_scan_bwd_dcb",
        bytes_moved=traffic(lambda z: 2 * z["x"] + 2 * z["dt"] + z["cb"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p),
        helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dcb"),
    # dCB and the intra-chunk ddA in one pass (our backward's form), against mamba-ssm's backward, which runs
    # the dCB kernel, then the stable ddA kernel on the same products.
    KernelEntry(
        name="chunk_scan_bwd_dcb_ddA", family="ssd", phase="bwd_11_14",
        replaces="_chunk_scan_bwd_dcb_kernel + _chunk_scan_bwd_ddAcs_stable_kernel",
        make_inputs=inputs_bwd_with_states, args=("x", "dt", "dA_cumsum", "dout", "seq_idx", "cb", "ngroups"),
        outputs=("dcb", "ddA"), reference=f"{REFERENCE}:chunk_scan_bwd_dcb",
        baseline="mamba2_kernels._mamba_ssm:dcb_and_intra_ddA",
        bytes_moved=traffic(lambda z: 2 * z["x"] + 2 * z["dt"] + 2 * z["cb"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p),
        helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dcb"),
    # bmm_chunk in that pass as well, which stores C B^T for the dx kernel (the backward's fused path where a GPU's
    # rule picks it), against mamba-ssm's bmm_chunk, dCB and stable ddA kernels.
    KernelEntry(
        name="bmm_chunk_scan_bwd_dcb", family="ssd", phase="bwd_4_11_14",
        replaces="_bmm_chunk_fwd_kernel + _chunk_scan_bwd_dcb_kernel + _chunk_scan_bwd_ddAcs_stable_kernel",
        make_inputs=inputs_bwd_with_states, args=("x", "dt", "dA_cumsum", "dout", "B", "C", "seq_idx", "ngroups"),
        outputs=("cb", "dcb", "ddA"), reference=f"{REFERENCE}:bmm_chunk_scan_bwd_dcb",
        baseline="mamba2_kernels._mamba_ssm:bmm_chunk_scan_bwd_dcb",
        bytes_moved=traffic(lambda z: 2 * z["x"] + 2 * z["dt"] + 2 * z["bc"] + 2 * z["cb"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p + 2 * b * c * G * Q * Q * n),
        helion="mamba2_kernels.ssd.chunk_scan_bwd:bmm_chunk_scan_bwd_dcb"),
    KernelEntry(
        name="bmm_chunk_bwd", family="ssd", phase="bwd_12", replaces="_bmm_chunk_bwd_kernel",
        make_inputs=inputs_bmm_chunk_bwd, args=("C", "dcb", "residual"), outputs=("dB",),
        reference=f"{REFERENCE}:bmm_chunk_bwd", baseline=f"{BMM}:_bmm_chunk_bwd",
        bytes_moved=traffic(lambda z: z["bc"] + z["cb"] + 2 * z["bc32"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 2 * b * c * G * Q * Q * n),
        helion="mamba2_kernels.ssd.bmm_chunk_bwd:bmm_chunk_bwd"),
    # The db and dC kernels and both bmm_chunk_bwd launches in one pass (the backward's fused path where a GPU's
    # rule picks it), against mamba-ssm's four kernels.
    KernelEntry(
        name="chunk_bwd_db_dc", family="ssd", phase="bwd_9_12",
        replaces="_chunk_state_bwd_db_kernel + _chunk_scan_bwd_dc_kernel + 2 x _bmm_chunk_bwd_kernel",
        make_inputs=inputs_db_dc,
        args=("x", "dt", "dA_cumsum", "B", "C", "dout", "prev_states", "dstates", "dcb", "seq_idx"),
        outputs=("dB", "dC", "ddA_next", "ddA_prev"), reference=f"{REFERENCE}:chunk_bwd_db_dc",
        baseline="mamba2_kernels._mamba_ssm:chunk_bwd_db_dc",
        bytes_moved=traffic(lambda z: 2 * z["x"] + 4 * z["dt"] + 2 * z["states"] + 4 * z["bc"] + z["cb"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 4 * b * L * h * p * n + 4 * b * c * G * Q * Q * n),
        helion="mamba2_kernels.ssd.chunk_bwd_db_dc:chunk_bwd_db_dc"),
    KernelEntry(
        name="chunk_scan_bwd_ddAcs_stable", family="ssd", phase="bwd_14",
        replaces="_chunk_scan_bwd_ddAcs_stable_kernel", make_inputs=inputs_bwd_with_states,
        args=("x", "dt", "dA_cumsum", "dout", "cb"), outputs=("ddA_cumsum",),
        reference=f"{REFERENCE}:chunk_scan_bwd_ddAcs_stable", baseline=f"{SCAN}:_chunk_scan_bwd_ddAcs_stable",
        bytes_moved=traffic(lambda z: 2 * z["x"] + 3 * z["dt"] + z["cb"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p),
        helion="mamba2_kernels.ssd.parity.chunk_scan_bwd_ddAcs_stable:chunk_scan_bwd_ddAcs_stable"),
    KernelEntry(
        name="chunk_cumsum_bwd", family="ssd", phase="bwd_15", replaces="_chunk_cumsum_bwd_kernel",
        make_inputs=inputs_chunk_cumsum_bwd,
        args=("ddA", "ddt_out", "dt_raw", "A", "dt_bias", "dt_softplus", "dt_limit"),
        outputs=("ddt", "dA", "ddt_bias"), reference=f"{REFERENCE}:chunk_cumsum_bwd",
        baseline=f"{STATE}:_chunk_cumsum_bwd", bytes_moved=traffic(lambda z: 2 * z["dt_raw"] + 2 * z["dt"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 10 * b * L * h),
        helion="mamba2_kernels.ssd.chunk_cumsum_bwd:chunk_cumsum_bwd"),
    # The same kernel building ddA from the three terms' partials (our backward's form), against those PyTorch
    # ops as our backward ran them before, then mamba-ssm's kernel.
    KernelEntry(
        name="chunk_cumsum_bwd_terms", family="ssd", phase="bwd_13_15",
        replaces="_chunk_cumsum_bwd_kernel + the ddA terms' PyTorch ops", make_inputs=inputs_chunk_cumsum_bwd_terms,
        args=("intra_steps", "next_steps", "prev_parts", "chunk_grad", "ddt_out", "dt_raw", "A", "dt_bias",
              "dt_softplus", "dt_limit"),
        outputs=("ddt", "dA", "ddt_bias"), reference=f"{REFERENCE}:chunk_cumsum_bwd_of_partial_terms",
        baseline="mamba2_kernels._mamba_ssm:chunk_cumsum_bwd_of_terms",
        bytes_moved=traffic(lambda z: 2 * z["dt_raw"] + 12 * z["dt"]),
        flops=flops_of(lambda b, L, h, p, G, n, Q, c: 24 * b * L * h),
        helion="mamba2_kernels.ssd.chunk_cumsum_bwd:chunk_cumsum_bwd_of_terms"),
)
