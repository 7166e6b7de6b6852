"""Context parallelism of the whole layer (``mamba2_kernels.context_parallel.mamba_split_conv1d_scan_combined_cp``):
a sequence split across 2 and 4 processes of a real gloo process group gives the whole sequence's output, final
state and gradients, checked against the fp64 reference of the unsplit layer (``mamba_split_conv1d_scan_ref`` under
autograd). The conv's window crosses the slices' edges: slices of one and two positions make a halo span several
ranks, and packed documents end inside halos."""

from __future__ import annotations

import pytest
import torch

from mamba2_kernels.layer_naive import mamba_split_conv1d_scan_ref
from mamba2_kernels.testing import execution_mode
from tests.process_group import collect, joined, spawn

BATCH, NHEADS, HEADDIM, NGROUPS, DSTATE, CHUNK, WIDTH, OUT_DIM = 2, 4, 8, 2, 8, 16, 4, 12
DIM = NHEADS * HEADDIM
WEIGHTS = ("conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "rmsnorm_weight", "outproj_weight", "outproj_bias")


def _inputs(seqlen: int, full_layer: bool) -> dict[str, torch.Tensor]:
    """The layer's arguments; ``full_layer``: with the gated norm, out_proj and a SwiGLU part (else the SSD's own
    z gate and no projection)."""
    g = torch.Generator().manual_seed(11)
    d_nonssm = 4 if full_layer else 0
    conv_dim = DIM + 2 * NGROUPS * DSTATE
    t = {"zxbcdt": torch.randn(BATCH, seqlen, 2 * d_nonssm + DIM + conv_dim + NHEADS, generator=g),
         "conv1d_weight": torch.randn(conv_dim, WIDTH, generator=g) * 0.5,
         "conv1d_bias": torch.randn(conv_dim, generator=g) * 0.1,
         "dt_bias": torch.rand(NHEADS, generator=g) - 1.0,
         "A": -torch.rand(NHEADS, generator=g) - 0.2,
         "D": torch.randn(NHEADS, HEADDIM, generator=g),
         "initial_states": torch.randn(BATCH, NHEADS, HEADDIM, DSTATE, generator=g),
         "dfinal": torch.randn(BATCH, NHEADS, HEADDIM, DSTATE, generator=g)}
    if full_layer:
        t["rmsnorm_weight"] = 1 + 0.1 * torch.randn(DIM, generator=g)
        t["outproj_weight"] = torch.randn(OUT_DIM, d_nonssm + DIM, generator=g) * 0.2
        t["outproj_bias"] = torch.randn(OUT_DIM, generator=g) * 0.1
        # Row 0: a document ending inside a two-position slice's halo, and one inside the last slice's halo.
        row = torch.zeros(seqlen, dtype=torch.int32)
        row[1:] = 1
        row[seqlen // 2:] = 2
        t["seq_idx"] = torch.stack([row, torch.zeros(seqlen, dtype=torch.int32)])
    t["dout"] = torch.randn(BATCH, seqlen, OUT_DIM if full_layer else DIM, generator=g)
    return t


def _call(layer, t: dict[str, torch.Tensor], **kwargs):
    return layer(t["zxbcdt"], t["conv1d_weight"], t["conv1d_bias"], t["dt_bias"], t["A"], t["D"], CHUNK,
                 initial_states=t["initial_states"], seq_idx=t.get("seq_idx"), dt_limit=(0.0, 5.0),
                 return_final_states=True, rmsnorm_weight=t.get("rmsnorm_weight"),
                 outproj_weight=t.get("outproj_weight"), outproj_bias=t.get("outproj_bias"), ngroups=NGROUPS,
                 norm_before_gate=False, **kwargs)


def _leaves(t: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: t[k].to(dtype, copy=True).requires_grad_() for k in ("zxbcdt", "initial_states", *WEIGHTS) if k in t}


def _worker(rank: int, world: int, port: int, seqlen: int, cuts: list[int], full_layer: bool, compiled: bool,
            result: str) -> None:
    with joined(rank, world, port):
        from mamba2_kernels.context_parallel import mamba_split_conv1d_scan_combined_cp

        layer = mamba_split_conv1d_scan_combined_cp
        if compiled:  # fullgraph: a graph break (a collective Dynamo cannot trace, say) fails the test
            layer = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
        full = _inputs(seqlen, full_layer)
        lo, hi = cuts[rank], cuts[rank + 1]
        sliced = {k: (v[:, lo:hi] if k in ("zxbcdt", "seq_idx", "dout") else v) for k, v in full.items()}
        leaves = _leaves(sliced, torch.float32)
        with execution_mode("ref"):
            out, final = _call(layer, {**sliced, **leaves})
            loss = (out * sliced["dout"]).sum()
            if rank == world - 1:
                loss = loss + (final * full["dfinal"]).sum()
            loss.backward()
        collect({"out": out.detach(), "final": final.detach(), **{k: v.grad for k, v in leaves.items()}},
                tuple(k for k in WEIGHTS if k in leaves), result)


def _reference(seqlen: int, full_layer: bool) -> dict[str, torch.Tensor]:
    full = _inputs(seqlen, full_layer)
    leaves = _leaves(full, torch.float64)
    out, final = _call(mamba_split_conv1d_scan_ref, {**full, **leaves})
    ((out * full["dout"].double()).sum() + (final * full["dfinal"].double()).sum()).backward()
    return {"out": out.detach(), "final": final.detach(), **{k: v.grad for k, v in leaves.items()}}


@pytest.mark.parametrize(("cuts", "full_layer", "compiled"),
                         [([0, 37, 80], False, False), ([0, 2, 3, 25, 48], True, False), ([0, 2, 48], True, True)],
                         ids=["2-ranks", "4-ranks-packed-norm-outproj", "2-ranks-compiled"])
def test_split_layer_gives_the_whole_sequences_outputs_and_gradients(cuts, full_layer, compiled, tmp_path):
    """Every gradient: the input's slices, the weights' parts summed over the ranks, the initial states' on
    rank 0; the final state's gradient enters on the last rank. Also under ``torch.compile(fullgraph=True)``,
    which traces the collectives and the halo into the graph."""
    world, seqlen = len(cuts) - 1, cuts[-1]
    result = tmp_path / "ranks.pt"
    spawn(_worker, world, seqlen, cuts, full_layer, compiled, str(result),
          preload=["mamba2_kernels.context_parallel", __name__])
    got = torch.load(result)
    ref = _reference(seqlen, full_layer)
    for name in ("out", "zxbcdt"):
        torch.testing.assert_close(torch.cat(got[name], dim=1).double(), ref[name], atol=2e-4, rtol=2e-4, msg=name)
    torch.testing.assert_close(got["final"][-1].double(), ref["final"], atol=2e-4, rtol=2e-4)
    for name in (*WEIGHTS, "initial_states"):
        if name in ref:
            torch.testing.assert_close(got[name][0].double(), ref[name], atol=2e-4, rtol=2e-4, msg=f"d{name}")


def test_the_layer_without_a_process_group_names_it():
    from mamba2_kernels.context_parallel import mamba_split_conv1d_scan_combined_cp

    with pytest.raises(ValueError, match="^group: torch.distributed is not initialized"):
        _call(mamba_split_conv1d_scan_combined_cp, _inputs(16, True))
