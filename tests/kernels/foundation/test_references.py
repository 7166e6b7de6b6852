"""The references agree: mamba-ssm's chunked reference (``ssd_chunk_scan_combined_ref``), our chunked
reference and our per-step recurrence (``mamba2_kernels.ssd.naive``). ``tests/kernels/ssd/test_naive.py`` adds
mamba-ssm's ``ssd_minimal_discrete`` and the per-stage references against mamba-ssm's Triton wrappers."""

from __future__ import annotations

import pytest
import torch

from mamba2_kernels import _mamba_ssm
from mamba2_kernels.ssd import naive


def _problem(seed, b=2, L=128, h=4, p=8, g=2, n=8):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    return {"x": r(b, L, h, p), "dt": r(b, L, h) * 0.5 - 3.0, "A": -torch.rand(h, generator=gen, dtype=torch.float64)
            * 4 - 0.5, "B": r(b, L, g, n), "C": r(b, L, g, n)}


@pytest.mark.parametrize("options", [
    {},
    {"D": "head", "dt_bias": True, "dt_softplus": True},
    {"D": "dim", "z": True, "dt_bias": True, "dt_softplus": True},
], ids=lambda o: "-".join(sorted(o)) or "plain")
def test_mamba_chunked_reference_ours_and_the_recurrence_agree(options):
    base = _problem(seed=len(options))
    if not options.get("dt_softplus"):  # dt as the layer hands it over: already positive
        base["dt"] = torch.nn.functional.softplus(base["dt"])
    h, p = base["x"].shape[2:]
    gen = torch.Generator().manual_seed(99)
    kwargs = {}
    if options.get("D") == "head":
        kwargs["D"] = torch.randn(h, generator=gen, dtype=torch.float64)
    elif options.get("D") == "dim":
        kwargs["D"] = torch.randn(h, p, generator=gen, dtype=torch.float64)
    if options.get("z"):
        kwargs["z"] = torch.randn(base["x"].shape, generator=gen, dtype=torch.float64)
    if options.get("dt_bias"):
        kwargs["dt_bias"] = torch.rand(h, generator=gen, dtype=torch.float64) - 2.0
    kwargs["dt_softplus"] = options.get("dt_softplus", False)
    theirs = _mamba_ssm.resolve(f"{_mamba_ssm.SSD_COMBINED}:ssd_chunk_scan_combined_ref")(
        **base, chunk_size=32, **kwargs)
    chunked = naive.ssd_chunked_ref(**base, chunk_size=32, **kwargs)
    recurrent = naive.ssd_recurrent_ref(**base, **kwargs)
    scale = recurrent.abs().max()
    torch.testing.assert_close(chunked, recurrent, atol=1e-11 * scale, rtol=0)
    # mamba-ssm's reference casts dt to fp32 before its cumsum: fp32-level agreement only.
    torch.testing.assert_close(theirs.double(), recurrent, atol=1e-5 * scale, rtol=0)
