"""Helion forms of mamba-ssm's unfused SSD kernels that no user call runs.

They exist only so that mamba-ssm's kernels can be timed one to one: each has a registry entry (with its
stored configs and baseline rows) that the guard tunes and benches against mamba-ssm's kernel of the same
name. ``kernels.ssd.combined`` (and so every user call) runs the fused forms instead, and nothing outside
this package and the registry imports from here:

  * ``chunk_state`` + ``state_passing``          -> ``kernels.ssd.chunk_state_passing``
  * ``chunk_scan_bwd_dstates`` + ``state_passing_bwd`` -> ``kernels.ssd.chunk_state_passing_bwd``
  * ``chunk_scan_bwd_ddAcs_stable``               -> ``kernels.ssd.chunk_scan_bwd.chunk_scan_bwd_dcb`` (``CB=``)

Their references are the unfused stages of ``kernels.ssd.naive``, which also define the fused stages'
references (``kernels.ssd.compose.chain_*``).
"""
