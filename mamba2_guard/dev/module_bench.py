"""The full mamba-ssm ``Mamba2`` module, its GEMMs included, on mamba-ssm's kernels and on ours.

Issue #5 reports the layer two ways: its own kernels (the bench's ``mamba2_layer_*`` entries) and the
whole ``Mamba2`` module as a model runs it: in_proj, the fused layer function, out_proj, and the gradients
of the input and every parameter. This script builds one ``Mamba2`` at a suite shape (``--d-model``: the
suite has no model width; nemotron3-nano's is 2688, mamba2-default's 2048), then times, interleaved in one
process as the bench times whole calls (CUDA-graph replays, L2 flushed before each; ``mamba2_guard.bench.timing``):

  * ``mamba_ssm``: the module as built, on mamba-ssm's kernels (and causal-conv1d's, when installed);
  * ``helion``: the same module under ``mamba2_kernels.patch_mamba_ssm()``;
  * ``gemms``: its two projections alone (forward, or forward and both gradients), for their share.

It also reports how far the patched module's output and gradients are from mamba-ssm's (the kernels'
precision is judged by the bench; this is a cross-check of the patch). With ``--compiled``, also the patched
module's training step in an eager loop, host included (``bench.timing.wall_interleaved``), eager against
``torch.compile(fullgraph=True, dynamic=True)`` in the mode it names (``reduce-overhead``: under CUDA graphs,
which take the host out of the step): compiling a model should never make its step slower. Writes one JSON file,
after each part, so that a run cut short keeps what it measured. A compiled step that fails (Inductor's CUDA graphs
refusing an operator's outputs, say) is recorded with its error and whole traceback, and the run exits 1.

    mamba2-guard dev module-bench --shape nemotron3-nano --d-model 2688 --compiled reduce-overhead --out module.json
"""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F

import mamba2_kernels
from mamba2_guard.adapters import fingerprint
from mamba2_guard.adapters.state import write_json
from mamba2_guard.bench.timing import Timer, synchronizer, wall_interleaved
from mamba2_guard.core import stats
from mamba2_guard.dev import require_gpu
from mamba2_kernels import suites
from mamba2_kernels.tuning import mamba_ssm


def build(shape: suites.ShapeSpec, d_model: int, device: str, seed: int) -> tuple[torch.nn.Module, torch.Tensor,
                                                                                  torch.Tensor]:
    """A ``Mamba2`` whose SSM part is ``shape``'s (all of d_inner: no MLP part), and (u, dout)."""
    mamba2 = mamba_ssm.module("modules.mamba2")
    torch.manual_seed(seed)
    # A fraction keeps d_inner = expand * d_model an int (Mamba2 floor-divides it) for widths such as 2688.
    module = mamba2.Mamba2(d_model=d_model, d_state=shape.dstate, d_conv=shape.conv_width,
                           expand=Fraction(shape.d_ssm, d_model), headdim=shape.headdim, ngroups=shape.ngroups,
                           chunk_size=shape.chunk_size, norm_before_gate=shape.norm_before_gate,
                           use_mem_eff_path=True, layer_idx=0, device=device, dtype=shape.torch_dtype)
    if module.norm.group_size != shape.norm_group_size:
        raise ValueError(f"--shape {shape.name}: Mamba2 normalizes groups of {module.norm.group_size}, the suite "
                         f"shape of {shape.norm_group_size}")
    g = torch.Generator(device=device).manual_seed(seed + 1)
    u = torch.randn(shape.batch, shape.seqlen, d_model, generator=g, device=device, dtype=shape.torch_dtype)
    dout = torch.randn(u.shape, generator=g, device=device, dtype=shape.torch_dtype) * 0.1
    return module, u.requires_grad_(True), dout


def _on_kernels(patched: bool) -> None:
    (mamba2_kernels.patch_mamba_ssm if patched else mamba2_kernels.unpatch_mamba_ssm)()


def module_call(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor, *, patched: bool,
                backward: bool) -> Callable[[], None]:
    """One forward (no autograd) or forward + backward of the module on the chosen kernels. The patch is
    set on every call: host work only, so a captured graph holds just the kernels it chose."""
    def forward() -> None:
        _on_kernels(patched)
        with torch.no_grad():
            module(u)

    def forward_backward() -> None:
        _on_kernels(patched)
        module(u).backward(dout)

    return forward_backward if backward else forward


def gemms_call(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor, *, backward: bool) -> Callable[[], None]:
    """The module's two projections alone, on tensors of the shapes they see."""
    hidden = torch.zeros(*u.shape[:-1], module.out_proj.in_features, device=u.device, dtype=u.dtype,
                         requires_grad=True)

    def run() -> None:
        with torch.set_grad_enabled(backward):
            zxbcdt = F.linear(u, module.in_proj.weight, module.in_proj.bias)
            out = F.linear(hidden, module.out_proj.weight, module.out_proj.bias)
            if backward:
                torch.autograd.backward((zxbcdt, out), (torch.ones_like(zxbcdt), dout))

    return run


def drop_gradients(module: torch.nn.Module, u: torch.Tensor) -> None:
    """The module's and the input's gradients set to None, as a training loop's ``zero_grad`` leaves them."""
    module.zero_grad(set_to_none=True)
    u.grad = None


def gradients(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor, *,
              patched: bool) -> dict[str, torch.Tensor]:
    """Output and every gradient of one forward + backward, from zeroed gradients."""
    drop_gradients(module, u)
    _on_kernels(patched)
    out = module(u)
    out.backward(dout)
    grads = {"out": out.detach().clone(), "du": u.grad.clone()}
    grads.update({f"d{name}": p.grad.clone() for name, p in module.named_parameters() if p.grad is not None})
    drop_gradients(module, u)
    return grads


def differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per tensor: max |ours - theirs|, and that over the rms of theirs (a scale-free figure)."""
    report = {}
    for name, ref in theirs.items():
        diff = (ours[name].double() - ref.double()).abs()
        rms = ref.double().square().mean().sqrt().item()
        report[name] = {"max_abs_diff": diff.max().item(), "max_abs_diff_over_rms": diff.max().item() / max(rms, 1e-30),
                        "mean_abs_diff": diff.mean().item(), "finite": bool(torch.isfinite(ours[name]).all())}
    return report


def summarize(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Medians, the speedup as the guard reports it (median of the paired rounds' ratios), GEMM shares."""
    medians = {name: stats.median(values) for name, values in samples.items()}
    return {"median_ms": medians, "speedup_vs_mamba_ssm": stats.speedup(samples["helion"], samples["mamba_ssm"]),
            "gemm_share": {name: medians["gemms"] / medians[name] for name in ("helion", "mamba_ssm")},
            "samples_ms": samples}


def compiled_step(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor, *, rounds: int, steps: int,
                  backend: Any = "inductor", mode: str = "default") -> dict[str, Any]:
    """The patched module's forward + backward, ``steps`` calls back to back per sample, eager against the module
    under ``torch.compile(fullgraph=True, dynamic=True, backend=backend, mode=mode)``, interleaved. The patch
    stays on throughout: switching it would fail the compiled module's guards and compile it again. Each step
    drops the gradients first, as a training loop's ``zero_grad`` does: under ``reduce-overhead`` (Inductor's
    CUDA graphs) a gradient is the graph's output until the next replay overwrites it, so it must not be
    accumulated into, and each step is marked as a new iteration. Leaves the gradients as it found them
    (none)."""
    _on_kernels(True)
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend=backend,
                             mode=None if mode == "default" else mode)
    started = time.monotonic()

    def training_step(forward: Callable[[torch.Tensor], torch.Tensor], graphed: bool) -> Callable[[], None]:
        def step() -> None:
            drop_gradients(module, u)
            if graphed:
                torch.compiler.cudagraph_mark_step_begin()
            forward(u).backward(dout)

        return step

    steps_of = {"eager": training_step(module, False), "compiled": training_step(compiled, mode == "reduce-overhead")}
    try:
        samples = wall_interleaved(steps_of, rounds=rounds, steps=steps, synchronize=synchronizer(u.device))
    finally:
        drop_gradients(module, u)
    return {"mode": mode, "median_ms": {name: stats.median(values) for name, values in samples.items()},
            "compiled_vs_eager": stats.speedup(samples["compiled"], samples["eager"]), "samples_ms": samples,
            "seconds": round(time.monotonic() - started, 1)}


def compiled_step_or_failure(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor, *, rounds: int,
                             steps: int, backend: Any = "inductor", mode: str = "default") -> dict[str, Any]:
    """``compiled_step``'s report, or where it raises the mode, the error in one line (the first of the error at
    the root of the chain) and the whole traceback (what a bug report needs): the module's other measurements
    stand either way."""
    try:
        return compiled_step(module, u, dout, rounds=rounds, steps=steps, backend=backend, mode=mode)
    except Exception as exc:
        cause = exc  # the error itself, not a wrapper's (Dynamo wraps a backend's in BackendCompilerFailed)
        while (inner := cause.__cause__ or getattr(cause, "inner_exception", None)) is not None:
            cause = inner
        first_line = (str(cause).strip().splitlines() or [""])[0]
        return {"mode": mode, "error": f"{type(cause).__name__}: {first_line}", "traceback": traceback.format_exc()}


def measure(shape: suites.ShapeSpec, d_model: int, *, rounds: int, seed: int, compiled: str | None = None,
            steps: int = 10, measured: Callable[[dict[str, Any]], None] = lambda result: None) -> dict[str, Any]:
    """The module both ways, its precision, and with ``compiled`` (a torch.compile mode) its compiled step;
    ``measured`` gets the result so far after each part."""
    module, u, dout = build(shape, d_model, "cuda", seed)
    timer = Timer("cuda")
    result: dict[str, Any] = {"shape": shape.name, "d_model": d_model,
                              "parameters": sum(p.numel() for p in module.parameters())}
    for phase, backward in (("fwd", False), ("fwd_bwd", True)):
        started = time.monotonic()
        fns = {"helion": module_call(module, u, dout, patched=True, backward=backward),
               "mamba_ssm": module_call(module, u, dout, patched=False, backward=backward),
               "gemms": gemms_call(module, u, dout, backward=backward)}
        result[phase] = {**summarize(timer.interleaved_graphs(fns, rounds=rounds)),
                         "seconds": round(time.monotonic() - started, 1)}
        measured(result)
        drop_gradients(module, u)
        torch.cuda.empty_cache()
    result["precision"] = differences(gradients(module, u, dout, patched=True),
                                      gradients(module, u, dout, patched=False))
    measured(result)
    if compiled:
        result["compiled_step"] = compiled_step_or_failure(module, u, dout, rounds=rounds, steps=steps,
                                                           mode=compiled)
        measured(result)
    mamba2_kernels.unpatch_mamba_ssm()
    return result


def require_causal_conv1d(parser: argparse.ArgumentParser) -> None:
    """One line and exit 2 where mamba-ssm found no causal-conv1d: its ``Mamba2`` runs the fused layer through
    that package's CUDA extension, which it imports only if installed, and would fail inside its forward."""
    if mamba_ssm.module("ops.triton.ssd_combined").causal_conv1d_fwd_function is None:
        parser.error("needs causal-conv1d, whose CUDA extension mamba-ssm's Mamba2 runs its layer through "
                     "(pip install causal-conv1d; offline, a wheel from scripts/build-causal-conv1d-wheel.sh)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    shape = suites.load().shape(args.shape)
    require_causal_conv1d(parser)
    require_gpu(parser, "it times the module")
    header = {"fingerprint": fingerprint.collect().to_dict(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "rounds": args.rounds, "steps": args.steps}
    measured = measure(shape, args.d_model, rounds=args.rounds, seed=args.seed, compiled=args.compiled,
                       steps=args.steps, measured=lambda result: write_json(args.out, {**header, **result}))
    return summary({**header, **measured}, args.d_model)


def summary(report: dict[str, Any], d_model: int) -> int:
    """Print a module-bench report's lines; 1 where its compiled step failed, else 0."""
    shape = report["shape"]
    for phase in ("fwd", "fwd_bwd"):
        r = report[phase]
        m = r["median_ms"]
        print(f"{shape} d_model={d_model} {phase}: ours {m['helion']:.3f} ms, "
              f"mamba-ssm {m['mamba_ssm']:.3f} ms ({r['speedup_vs_mamba_ssm']:.3f}x); "
              f"the two GEMMs {m['gemms']:.3f} ms")
    worst = max(report["precision"].items(), key=lambda kv: kv[1]["max_abs_diff_over_rms"])
    print(f"largest difference from mamba-ssm: {worst[0]} {worst[1]['max_abs_diff']:.3g} "
          f"({worst[1]['max_abs_diff_over_rms']:.3g} of its rms)")
    step = report.get("compiled_step")
    if step is None:
        return 0
    if "error" in step:
        print(f"{shape} d_model={d_model} fwd_bwd under torch.compile ({step['mode']}): FAILED {step['error']} "
              f"(the whole traceback is in the report's compiled_step)")
        return 1
    print(f"{shape} d_model={d_model} fwd_bwd in an eager loop, ours: eager "
          f"{step['median_ms']['eager']:.3f} ms, torch.compile ({step['mode']}) "
          f"{step['median_ms']['compiled']:.3f} ms ({step['compiled_vs_eager']:.3f}x eager)")
    return 0
