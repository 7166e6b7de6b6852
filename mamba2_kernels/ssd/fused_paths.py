"""The SSD's fused stages, each as one fused kernel or as the kernels it fuses, by the GPU's rule.

The state pass, forward and backward. The fused kernels (``mamba2_kernels.ssd.chunk_state_passing`` and
``..._bwd``) walk the chunks in order, one program per (batch, head, headdim block, dstate block): they never write
the per-chunk states, but their parallel work is only the state's elements. At long chunks and small states (few
heads, batch 1) the walk leaves most of the GPU idle, and mamba-ssm's two kernels, parallel over chunks too
(``mamba2_kernels.ssd.parity``: chunk states, then an associative scan over chunks), are faster despite the states
they write and read back. Which one runs is the GPU's fitted ``ChainRule`` (the config file's
``selection.<stage>.chain``, ``mamba2_kernels.config_store``; a GPU without a file of its own takes that of the GPU
whose file serves its configs); without a rule the fused kernel runs. ``docs/config-selection.md`` says how the
rule is measured and fitted.

The forward's outputs (``bmm_chunk_scan_fwd``). Fused, chunk_scan computes each cb tile (C B^T) where it uses
it and never stores cb (``mamba2_kernels.ssd.chunk_scan``); but it computes it once per head and headdim block,
where bmm_chunk computes it once per group and every head of the group reads it back. Few heads per group
favour the fusion, many favour the chain. It runs fused only where the GPU's file says so (a ``FuseRule``:
``selection.chunk_scan.fuse``); without a rule the chain runs, as it did before the fusion existed.

The cumsum of dt in the forward's state pass (``chunk_cumsum_state_passing_fwd``). Fused, the state pass makes
dt_out and dA_cumsum from the call's dt itself (``mamba2_kernels.ssd.chunk_state_passing``): one launch and a
round trip of both through memory fewer, for a scan that every program of a head repeats. It can join the
state pass only where that pass runs fused (its chain rule); where the fuse rule
(``selection.chunk_cumsum_state_passing.fuse``) says so, the forward is two launches. Without a rule, the chain.

The whole forward (``ssd_fwd``). Fused, chunk_cumsum, then one program per (batch, head, headdim block) walks the
chunks, carrying the state in registers, and makes each chunk's C B^T and outputs
(``mamba2_kernels.ssd.ssd_fused_fwd``): no per-chunk states in memory, x read once, two launches. Chained, the
launches the rules above pick. The walk's parallel work is only batch x heads x headdim blocks, and every
program of a group makes C B^T again; its rule is a ``FuseRule`` (``selection.ssd_fused_fwd.fuse``), without
one the chain. Varlen states need the states entering each chunk, so a call that asks for them takes the chain.

The backward's C B^T (``bmm_chunk_scan_bwd_dcb``). Fused, the dCB kernel makes each tile of it, which it uses
for the intra-chunk ddA, and stores it for the dx kernel (``mamba2_kernels.ssd.chunk_scan_bwd``): bmm_chunk's
launch and the dCB stage's read of it fewer, for tiles that each head split of a group makes again (up to
four). Its rule is a ``FuseRule`` (``selection.chunk_scan_bwd_dcb.fuse``); without one, the chain.

The gradients of B and C (``chunk_bwd_db_dc``). Fused, one pass computes both with their intra-chunk terms and
stores them in their dtypes (``mamba2_kernels.ssd.chunk_bwd_db_dc``); chained, the db and dC kernels write fp32
partials that two bmm_chunk_bwd launches read back. The fused pass cannot split a group's heads over programs,
as the db and dC kernels can: many heads per group favour the chain. Its rule is a ``FuseRule`` too
(``selection.chunk_bwd_db_dc.fuse``); without one the chain runs.
"""

from __future__ import annotations

import functools
import sys
import types

import torch

from mamba2_kernels import config_store
from mamba2_kernels._runtime import device_capability, device_slug
from mamba2_kernels.ssd import compose
from mamba2_kernels.ssd.bmm_chunk import bmm_chunk_fwd
from mamba2_kernels.ssd.bmm_chunk_bwd import bmm_chunk_bwd
from mamba2_kernels.ssd.chunk_bwd_db_dc import chunk_bwd_db_dc as fused_db_dc
from mamba2_kernels.ssd.chunk_cumsum import chunk_cumsum_fwd
from mamba2_kernels.ssd.chunk_scan import bmm_chunk_scan_fwd as fused_scan
from mamba2_kernels.ssd.chunk_scan import chunk_scan_fwd
from mamba2_kernels.ssd.chunk_scan_bwd import bmm_chunk_scan_bwd_dcb as fused_dcb
from mamba2_kernels.ssd.chunk_scan_bwd import chunk_scan_bwd_dC, chunk_scan_bwd_dcb
from mamba2_kernels.ssd.chunk_state_bwd import chunk_state_bwd_db
from mamba2_kernels.ssd.chunk_state_passing import chunk_cumsum_state_passing_fwd as fused_cumsum_fwd
from mamba2_kernels.ssd.chunk_state_passing import chunk_state_passing_fwd as fused_fwd
from mamba2_kernels.ssd.chunk_state_passing_bwd import chunk_state_passing_bwd as fused_bwd
from mamba2_kernels.ssd.forcing import (  # noqa: F401 (re-exported)
    BWD,
    CUMSUM,
    DB_DC,
    DCB,
    FUSE_STAGES,
    FWD,
    ONE_PASS,
    PATHS,
    SCAN,
    STAGES,
    forced,
    forced_path,
)
from mamba2_kernels.ssd.parity.chunk_scan_bwd_dstates import chunk_scan_bwd_dstates
from mamba2_kernels.ssd.parity.chunk_state import chunk_state_fwd
from mamba2_kernels.ssd.parity.state_passing import state_passing_fwd
from mamba2_kernels.ssd.parity.state_passing_bwd import state_passing_bwd
from mamba2_kernels.ssd.ssd_fused_fwd import ssd_fused_fwd

# The kernels each chain runs; the ddA terms of the dCB, db and dC kernels stay partials, as the fused kernels' do.
CHAIN_STAGES = types.SimpleNamespace(chunk_state_fwd=chunk_state_fwd, state_passing_fwd=state_passing_fwd,
                                     chunk_scan_bwd_dstates=chunk_scan_bwd_dstates, state_passing_bwd=state_passing_bwd,
                                     bmm_chunk_fwd=bmm_chunk_fwd, chunk_scan_fwd=chunk_scan_fwd,
                                     chunk_scan_bwd_dcb=functools.partial(chunk_scan_bwd_dcb, unfinished=True),
                                     chunk_state_bwd_db=functools.partial(chunk_state_bwd_db, unfinished=True),
                                     chunk_scan_bwd_dC=functools.partial(chunk_scan_bwd_dC, unfinished=True),
                                     bmm_chunk_bwd=bmm_chunk_bwd)


def state_elements(batch: int, nheads: int, headdim: int, dstate: int) -> int:
    return batch * nheads * headdim * dstate


def chained(stage: str, x: torch.Tensor, dstate: int, chunk_size: int) -> bool:
    """Whether ``stage`` (a state pass) runs as its chain for a call with ``x`` (batch, seqlen, nheads, headdim)."""
    path = forced_path(stage)
    if path is not None:
        return path == "chain"
    cf = config_store.serving_file(device_slug(x.device), device_capability(x.device))
    batch, _, nheads, headdim = x.shape
    return cf is not None and chains_by_rule(cf, stage, batch, nheads, headdim, dstate, chunk_size)


def runs_fused(stage: str, x: torch.Tensor, ngroups: int) -> bool:
    """Whether ``stage`` (one of ``FUSE_STAGES``) runs its fused kernel for a call with ``x``."""
    path = forced_path(stage)
    if path is not None:
        return path == "fused"
    cf = config_store.serving_file(device_slug(x.device), device_capability(x.device))
    return cf is not None and fuses_by_rule(cf, stage, x.shape[2] // ngroups)


def fuses_by_rule(cf: config_store.ConfigFile, stage: str, heads_per_group: int) -> bool:
    """Whether ``cf``'s fuse rule for ``stage`` fuses a call with these heads per group (no rule: the chain)."""
    rule = cf.fuse_rule(stage)
    return rule is not None and rule.fuses(heads_per_group)


def chains_by_rule(cf: config_store.ConfigFile, stage: str, batch: int, nheads: int, headdim: int, dstate: int,
                   chunk_size: int) -> bool:
    """Whether ``cf``'s chain rule for ``stage`` chains a call of these sizes (no rule: fused)."""
    rule = cf.chain_rule(stage)
    return rule is not None and rule.chains(chunk_size, state_elements(batch, nheads, headdim, dstate))


def chunk_cumsum_state_passing_fwd(dt, A, B, x, chunk_size, dt_bias=None, dt_softplus=False,
                                   dt_limit=(0.0, float("inf")), initial_states=None, seq_idx=None, out_dtype=None):
    """``mamba2_kernels.ssd.naive.chunk_cumsum_state_passing_fwd``'s results: one kernel where the state pass runs
    fused and the cumsum's rule fuses it in, else chunk_cumsum and then the state pass by its own rule (looked
    up once for both)."""
    options = {"dt_bias": dt_bias, "dt_softplus": dt_softplus, "dt_limit": dt_limit,
               "initial_states": initial_states, "seq_idx": seq_idx, "out_dtype": out_dtype}
    state_pass_chained = chained(FWD, x, B.shape[-1], chunk_size)
    if not state_pass_chained and runs_fused(CUMSUM, x, B.shape[2]):
        return fused_cumsum_fwd(dt, A, B, x, chunk_size, **options)
    state_pass = (functools.partial(compose.chain_chunk_state_passing, CHAIN_STAGES) if state_pass_chained
                  else fused_fwd)
    stages = types.SimpleNamespace(chunk_cumsum_fwd=chunk_cumsum_fwd, chunk_state_passing_fwd=state_pass)
    return compose.chain_chunk_cumsum_state_passing(stages, dt, A, B, x, chunk_size, **options)


def chunk_state_passing_bwd(C, dA_cumsum, dout, states, dfinal_states=None, seq_idx=None, has_initial_states=False,
                            dstates_dtype=None, states_dtype=None, dstates_in=None):
    """``mamba2_kernels.ssd.chunk_state_passing_bwd.chunk_state_passing_bwd``, by the path the rule picks; with
    ``dstates_in`` (a gradient of the states entering each chunk from elsewhere: the varlen states') always the
    chain, which has those states' gradient in hand between its two kernels (the fused pass never writes it)."""
    options = {"dfinal_states": dfinal_states, "seq_idx": seq_idx, "has_initial_states": has_initial_states,
               "dstates_dtype": dstates_dtype, "states_dtype": states_dtype}
    if dstates_in is not None or chained(BWD, dout, C.shape[-1], dA_cumsum.shape[-1]):
        return compose.chain_chunk_state_passing_bwd(CHAIN_STAGES, C, dA_cumsum, dout, states, dstates_in=dstates_in,
                                                     **options)
    return fused_bwd(C, dA_cumsum, dout, states, **options)


def bmm_chunk_scan_fwd(x, dt, dA_cumsum, B, C, states, D=None, z=None, seq_idx=None):
    """``mamba2_kernels.ssd.naive.bmm_chunk_scan_fwd``'s results, by the path the rule picks."""
    if runs_fused(SCAN, x, C.shape[2]):
        return fused_scan(x, dt, dA_cumsum, B, C, states, D=D, z=z, seq_idx=seq_idx)
    return compose.chain_bmm_chunk_scan(CHAIN_STAGES, x, dt, dA_cumsum, B, C, states, D=D, z=z, seq_idx=seq_idx)


def bmm_chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, B, C, seq_idx=None, ngroups=1):
    """``mamba2_kernels.ssd.naive.bmm_chunk_scan_bwd_dcb``'s results, by the path the rule picks, with the ddA as
    partials for ``chunk_cumsum_bwd_of_terms``."""
    if runs_fused(DCB, x, ngroups):
        return fused_dcb(x, dt, dA_cumsum, dout, B, C, seq_idx=seq_idx, ngroups=ngroups, unfinished=True)
    return compose.chain_bmm_chunk_scan_bwd_dcb(CHAIN_STAGES, x, dt, dA_cumsum, dout, B, C, seq_idx=seq_idx,
                                                ngroups=ngroups)


def chunk_bwd_db_dc(x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx=None, dB=None, dC=None):
    """``mamba2_kernels.ssd.naive.chunk_bwd_db_dc``'s results, by the path the rule picks, with the ddA terms as
    partials for ``chunk_cumsum_bwd_of_terms``."""
    args = (x, dt, dA_cumsum, B, C, dout, states, dstates, dcb)
    if runs_fused(DB_DC, x, B.shape[2]):
        return fused_db_dc(*args, seq_idx=seq_idx, dB=dB, dC=dC, unfinished=True)
    return compose.chain_chunk_bwd_db_dc(CHAIN_STAGES, *args, seq_idx=seq_idx, dB=dB, dC=dC)


def ssd_fwd(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
            dt_softplus=False, dt_limit=(0.0, float("inf")), state_dtype=None):
    """``mamba2_kernels.ssd.naive.ssd_fwd``'s results: chunk_cumsum and one launch for the rest where the rule
    picks it, else the chain of ``chunk_cumsum_state_passing_fwd`` and ``bmm_chunk_scan_fwd`` by their own rules.
    ``state_dtype`` changes only the states the chain keeps between its launches, never the outputs (chunk_scan
    rounds the states to C's dtype either way), so the one launch takes no state dtype."""
    if runs_fused(ONE_PASS, x, B.shape[2]):
        dA_cumsum, dt_out = chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                             dt_limit=dt_limit)
        return ssd_fused_fwd(x, dt_out, dA_cumsum, B, C, D=D, z=z, initial_states=initial_states, seq_idx=seq_idx)
    return compose.chain_ssd_fwd(sys.modules[__name__], x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                 initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
                                 dt_limit=dt_limit, state_dtype=state_dtype)
