"""Helion forms of mamba-ssm's unfused SSD kernels, one to one.

Each has a registry entry (with its stored configs and baseline rows) that the guard tunes and benches
against mamba-ssm's kernel of the same name. ``mamba2_kernels.ssd.combined`` runs the fused forms instead, except
where the GPU's fitted rule runs a fused state pass as its two kernels (``mamba2_kernels.ssd.fused_paths``, the one
importer of this package outside it and the registry):

  * ``chunk_state`` + ``state_passing``          -> ``mamba2_kernels.ssd.chunk_state_passing``
  * ``chunk_scan_bwd_dstates`` + ``state_passing_bwd`` -> ``mamba2_kernels.ssd.chunk_state_passing_bwd``
  * ``chunk_scan_bwd_ddAcs_stable``               -> ``mamba2_kernels.ssd.chunk_scan_bwd.chunk_scan_bwd_dcb`` (``CB=``)

Their references are the unfused stages of ``mamba2_kernels.ssd.naive``, which also define the fused stages'
references (``mamba2_kernels.ssd.compose.chain_*``).
"""
