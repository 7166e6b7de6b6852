"""Context parallelism (``mamba2_kernels.context_parallel``): a sequence split across 2 and 4 processes of a
real gloo process group gives the whole sequence's outputs, final state and gradients, checked against the
fp64 reference of the unsplit call (``ssd_chunked_ref`` under autograd)."""

from __future__ import annotations

import pytest
import torch

from mamba2_kernels.ssd.naive import ssd_chunked_ref
from mamba2_kernels.testing import execution_mode
from tests.process_group import collect, joined, spawn

BATCH, NHEADS, HEADDIM, NGROUPS, DSTATE, CHUNK = 2, 4, 8, 2, 8, 16
SHARED = ("A", "D", "dt_bias")  # the same on every rank: their gradients are summed over the ranks


def _inputs(seqlen: int, seq_idx: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    t = {"x": torch.randn(BATCH, seqlen, NHEADS, HEADDIM, generator=g),
         "dt": torch.rand(BATCH, seqlen, NHEADS, generator=g) - 0.5,
         "A": -torch.rand(NHEADS, generator=g) - 0.2,
         "B": torch.randn(BATCH, seqlen, NGROUPS, DSTATE, generator=g),
         "C": torch.randn(BATCH, seqlen, NGROUPS, DSTATE, generator=g),
         "D": torch.randn(NHEADS, HEADDIM, generator=g),
         "z": torch.randn(BATCH, seqlen, NHEADS, HEADDIM, generator=g),
         "dt_bias": torch.rand(NHEADS, generator=g),
         "initial_states": torch.randn(BATCH, NHEADS, HEADDIM, DSTATE, generator=g),
         "dout": torch.randn(BATCH, seqlen, NHEADS, HEADDIM, generator=g),
         "dfinal": torch.randn(BATCH, NHEADS, HEADDIM, DSTATE, generator=g)}
    if seq_idx:
        # Row 0: a document boundary inside a slice, one exactly at a slice boundary, and a slice of one
        # document that a state crosses; row 1: one document.
        row = torch.zeros(seqlen, dtype=torch.int32)
        row[20:] = 1
        row[seqlen // 2:] = 2
        t["seq_idx"] = torch.stack([row, torch.zeros(seqlen, dtype=torch.int32)])
    return t


def _worker(rank: int, world: int, port: int, seqlen: int, cuts: list[int], seq_idx: bool, result: str) -> None:
    with joined(rank, world, port):
        from mamba2_kernels.context_parallel import mamba_chunk_scan_combined_cp

        full = _inputs(seqlen, seq_idx)
        lo, hi = cuts[rank], cuts[rank + 1]
        sliced = {k: (v[:, lo:hi] if k in ("x", "dt", "B", "C", "z", "dout", "seq_idx") else v)
                  for k, v in full.items()}
        leaves = {k: sliced[k].clone().requires_grad_() for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias",
                                                                  "initial_states")}
        with execution_mode("ref"):
            out, final = mamba_chunk_scan_combined_cp(
                leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], CHUNK, D=leaves["D"],
                z=leaves["z"], dt_bias=leaves["dt_bias"], initial_states=leaves["initial_states"],
                seq_idx=sliced.get("seq_idx"), dt_softplus=True, dt_limit=(0.0, 5.0), return_final_states=True)
            loss = (out * sliced["dout"]).sum()
            if rank == world - 1:
                loss = loss + (final * full["dfinal"]).sum()
            loss.backward()
        collect({"out": out.detach(), "final": final.detach(), **{k: v.grad for k, v in leaves.items()}}, SHARED,
                result)


def _reference(seqlen: int, seq_idx: bool) -> dict[str, torch.Tensor]:
    full = _inputs(seqlen, seq_idx)
    leaves = {k: full[k].double().requires_grad_() for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias",
                                                             "initial_states")}
    out, final = ssd_chunked_ref(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], CHUNK,
                                 D=leaves["D"], z=leaves["z"], dt_bias=leaves["dt_bias"],
                                 initial_states=leaves["initial_states"], seq_idx=full.get("seq_idx"),
                                 dt_softplus=True, dt_limit=(0.0, 5.0), return_final_states=True)
    ((out * full["dout"].double()).sum() + (final * full["dfinal"].double()).sum()).backward()
    return {"out": out.detach(), "final": final.detach(), **{k: v.grad for k, v in leaves.items()}}


@pytest.mark.parametrize(("cuts", "seq_idx"), [([0, 37, 80], False), ([0, 16, 40, 41, 80], True)],
                         ids=["2-ranks", "4-ranks-packed"])
def test_split_sequence_gives_the_whole_sequences_outputs_and_gradients(cuts, seq_idx, tmp_path):
    """Slices of other lengths than the chunk (and a slice of one token), z, D per head dim, dt_bias,
    softplus, dt_limit, initial states on rank 0, the final state's gradient on the last rank; with packed
    documents on 4 ranks."""
    world, seqlen = len(cuts) - 1, cuts[-1]
    result = tmp_path / "ranks.pt"
    spawn(_worker, world, seqlen, cuts, seq_idx, str(result), preload=["mamba2_kernels.context_parallel", __name__])
    got = torch.load(result)
    ref = _reference(seqlen, seq_idx)
    for name in ("out", "x", "dt", "B", "C", "z"):
        torch.testing.assert_close(torch.cat(got[name], dim=1).double(), ref[name], atol=2e-4, rtol=2e-4, msg=name)
    torch.testing.assert_close(got["final"][-1].double(), ref["final"], atol=2e-4, rtol=2e-4)
    for name in (*SHARED, "initial_states"):
        torch.testing.assert_close(got[name][0].double(), ref[name], atol=2e-4, rtol=2e-4, msg=f"d{name}")


def test_without_a_process_group_the_error_names_it():
    from mamba2_kernels.context_parallel import mamba_chunk_scan_combined_cp

    t = _inputs(32, False)
    with pytest.raises(ValueError, match="^group: torch.distributed is not initialized"):
        mamba_chunk_scan_combined_cp(t["x"], t["dt"], t["A"], t["B"], t["C"], CHUNK)
