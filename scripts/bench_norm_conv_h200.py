"""Time the gated RMSNorm and causal conv1d Helion kernels on a GPU against mamba-ssm (norm) and against
the measured copy bandwidth, at one suite shape; write a JSON record.

    python scripts/bench_norm_conv_h200.py --shape nemotron3-nano --out measurements.json

Timing: ``guard.bench.timing.Timer.interleaved`` (L2 flushed before every call, ABBA rounds); medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import traceback
from importlib.metadata import PackageNotFoundError, version

import torch

NORM = ("gated_rmsnorm_fwd", "gated_rmsnorm_bwd")
CONV = ("causal_conv1d_fwd", "causal_conv1d_bwd")


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - best effort
        return None


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _max_err(a: dict, b: dict) -> dict[str, float]:
    return {k: float((a[k].double() - b[k].to(a[k].device).double()).abs().max()) for k in a if k in b}


def main() -> int:
    from guard.bench.timing import Timer, copy_bandwidth
    from kernels import config_store, registry, suites
    from kernels._runtime import device_slug

    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="nemotron3-nano")
    parser.add_argument("--kernels", nargs="+", default=list(NORM + CONV))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    shape = suites.load().shape(args.shape)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0), "driver": _driver(), "python": platform.python_version(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": _version("triton"),
        "helion": _version("helion"), "mamba_ssm": _version("mamba-ssm"), "shape": args.shape,
        "timing": f"guard.bench.timing.Timer.interleaved, L2 flushed, {args.rounds} ABBA rounds, median ms",
        "kernels": {},
    }
    bw = copy_bandwidth(device)
    record["copy_bandwidth_GBps"] = bw / 1e9
    timer = Timer(device)
    for name in args.kernels:
        entry = registry.get(name)
        res: dict = {}
        record["kernels"][name] = res
        try:
            inputs = entry.inputs(shape, 0, device)
            kernel_fn = entry.helion_fn()
            call_args = tuple(inputs[a] for a in entry.args)
            fns = {"helion": lambda f=kernel_fn, a=call_args: f(*a)}
            ours = entry.run_helion(inputs)
            ref = entry.run_reference(inputs, torch.float32)
            res["max_abs_err_vs_fp32_ref"] = _max_err(ours, ref)
            try:
                base_fn = entry.baseline_fn()
                base = entry.run_baseline(inputs)
                res["max_abs_err_vs_baseline"] = _max_err(ours, base)
                res["baseline"] = entry.baseline
                fns["baseline"] = lambda f=base_fn, a=call_args: f(*a)
            except Exception as exc:  # noqa: BLE001
                res["baseline_unavailable"] = f"{type(exc).__name__}: {exc}"[:300]
            samples = timer.interleaved(fns, rounds=args.rounds, warmup=3)
            nbytes = entry.bytes_moved(shape)
            res["bytes_model"] = nbytes
            for impl, xs in samples.items():
                ms = _median(xs)
                res[f"{impl}_ms"] = ms
                res[f"{impl}_frac_copy_bw"] = nbytes / (ms / 1e3) / bw
            if "baseline" in samples:
                ratios = [b / h for h, b in zip(samples["helion"], samples["baseline"], strict=True)]
                res["speedup_vs_baseline_median_of_rounds"] = _median(ratios)
            found = [entry.name, None]
            for kernel, kargs in _launches(entry, inputs):
                found[1] = config_store.lookup(kernel.name, kernel.shape_key(*kargs), device_slug(device)).source
                res.setdefault("configs", {})[kernel.name] = found[1]
        except Exception as exc:  # noqa: BLE001
            res["error"] = traceback.format_exc()[-2000:]
            print(name, "failed:", exc, flush=True)
        print(name, json.dumps(res, default=str), flush=True)
    with open(args.out, "w") as handle:
        json.dump(record, handle, indent=2, default=str)
    return 0


def _launches(entry, inputs):
    from kernels._runtime import capture_launches

    with capture_launches() as launches:
        entry.run_helion(inputs)
    return launches


if __name__ == "__main__":
    raise SystemExit(main())
