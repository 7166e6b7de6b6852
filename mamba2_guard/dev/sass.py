"""SASS of the kernels a registry entry launches, compiled offline with the stored configs: no GPU needed.

Device time is scarce; instruction counts, registers, spills and the opcode mix are not. For each entry this
runs the entry's public function once on CPU tensors in Helion's ref mode to capture every kernel launch and
its exact arguments, looks up each kernel's stored config for ``--gpu-slug`` (Helion's default where none is
stored), generates the Triton code, and compiles it for ``--arch`` with the installed Triton's own compiler
and ``nvdisasm``. The counts are this machine's Triton's, which may differ from the GPU host's.

How exp2/rsqrt replaced libdevice's exp and the IEEE division in the hot loops was found this way (docs/kernels.md,
"exp2 and rsqrt in the hot loops"); the dx kernel shows that fewer instructions are not always faster.

    mamba2-guard dev sass chunk_scan causal_conv1d_bwd --shape nemotron3-nano --seqlen 512
    mamba2-guard dev sass chunk_scan --out /tmp/sass --json /tmp/sass.json   # code, PTX and SASS too

Run it in a fresh process: the test set-up's CPU-interpreter patches (``mamba2_kernels.testing``) rewrite
Triton's libdevice, and code compiled after them is not what the GPU runs.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# Triton reads this at import: under the interpreter its kernels would not compile to SASS.
os.environ.pop("TRITON_INTERPRET", None)

from mamba2_kernels import registry, suites  # noqa: E402
from mamba2_kernels.config_store import SLUG_ENV  # noqa: E402
from mamba2_kernels.files import atomic_write  # noqa: E402
from mamba2_kernels.tuning import TunedKernel, capture_launches  # noqa: E402

_SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
                 torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.bool: "i1"}


@dataclass
class SassReport:
    kernel: str
    config_source: str  # "exact", "nearest" or "default"
    instructions: int
    registers: int
    stack_bytes: int  # spills
    shared_bytes: int
    opcodes: dict[str, int] = field(default_factory=dict)
    dropped_config_keys: list[str] = field(default_factory=list)


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _launch_of(bound: Any, host_name: str, config: Any,
               args: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
    """The Triton kernel, its launch arguments and options, and the generated code, without launching it."""
    code = bound.to_triton_code(config)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "generated.py"
        path.write_text(code)
        spec = importlib.util.spec_from_file_location(f"sass_report_{id(bound)}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # Triton resolves the kernel's globals through its module
        spec.loader.exec_module(module)
    launched: dict[str, Any] = {}

    def record(kernel, grid, *launch_args, num_warps=4, num_stages=1, **options):
        launched.update(kernel=kernel, args=launch_args, options={"num_warps": num_warps, "num_stages": num_stages})

    getattr(module, host_name)(*args, _launcher=record)
    return launched["kernel"], launched["args"], launched["options"], code


def _source(kernel: Any, launch_args: tuple[Any, ...]) -> Any:
    """Triton's compile input with the launch's specializations: 16-byte aligned pointers, ints divisible by
    16, ints equal to 1 as constants (what the runtime's launch specializes)."""
    import triton

    signature, constants, attrs = {}, {}, {}
    for index, (param, value) in enumerate(zip(kernel.params, launch_args, strict=True)):
        if param.is_constexpr or value is None or (type(value) is int and value == 1):
            signature[param.name] = "constexpr"
            constants[(index,)] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TRITON_TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"launch argument {param.name}: unsupported type {type(value).__name__}")
    return triton.compiler.ASTSource(kernel, signature, constexprs=constants, attrs=attrs)


def compile_sass(tuned: TunedKernel, args: tuple[Any, ...], config: dict[str, Any] | None, arch: int,
                 config_source: str, out_dir: Path | None = None) -> SassReport:
    import helion
    import triton
    from triton.backends.compiler import GPUTarget

    bound = tuned.bound(args)
    default = dict(bound.config_spec.default_config())
    # A config stored by another helion release may carry keys this one rejects (1.5.0's
    # host_tensor_descriptors under 1.5.1): they are dropped and named in the report.
    config = default if config is None else dict(config)
    dropped = sorted(set(config) - set(default))
    config = {k: v for k, v in config.items() if k not in dropped}
    kernel, launch_args, options, code = _launch_of(bound, tuned.fn.__name__, helion.Config(**config), args)
    compiled = triton.compile(_source(kernel, launch_args), target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
    resources = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", usage))
    opcodes = collections.Counter(m.group(1) for m in map(_SASS_LINE.match, sass.splitlines()) if m)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".py", code), (".ptx", compiled.asm["ptx"]), (".sass", sass)):
            atomic_write(out_dir / f"{tuned.name}{suffix}", text)
    return SassReport(kernel=tuned.name, config_source=config_source, instructions=sum(opcodes.values()),
                      registers=int(resources.get("REG", 0)), stack_bytes=int(resources.get("STACK", 0)),
                      shared_bytes=compiled.metadata.shared, opcodes=dict(opcodes.most_common()),
                      dropped_config_keys=dropped)


def entry_reports(name: str, shape: suites.ShapeSpec, arch: int, out_dir: Path | None = None) -> list[SassReport]:
    """One report per kernel launch of the registry entry ``name`` at ``shape`` (configs of $MAMBA2_GUARD_GPU_SLUG)."""
    from mamba2_kernels import testing

    testing.patch_mm_out_dtype()  # ref mode's matmuls on CPU; Triton's libdevice stays as the GPU sees it
    entry = registry.get(name)
    inputs = entry.inputs(shape, 0, "cpu")
    with capture_launches() as launches:
        entry.run_helion(inputs)
    reports = []
    for tuned, args in launches:
        found = tuned.lookup(*args)
        source = "default" if found.config is None else found.source
        reports.append(compile_sass(tuned, args, found.config, arch, source,
                                    out_dir / name if out_dir is not None else None))
    return reports


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for name in opts.entries:
        if name not in registry.REGISTRY:
            parser.error(f"ENTRY: expected one of {sorted(registry.REGISTRY)}, got {name!r}")
    os.environ[SLUG_ENV] = opts.gpu_slug
    shape = suites.load().shape(opts.shape).replace(seqlen=opts.seqlen, batch=1)
    results = {}
    for name in opts.entries:
        results[name] = [asdict(r) for r in entry_reports(name, shape, opts.arch, opts.out)]
        for r in results[name]:
            top = ", ".join(f"{op} {n}" for op, n in list(r["opcodes"].items())[:6])
            dropped = ", ".join(r["dropped_config_keys"])
            print(f"{name}: {r['kernel']} ({r['config_source']} config): {r['instructions']} instructions, "
                  f"{r['registers']} registers, {r['stack_bytes']} B stack, {r['shared_bytes']} B shared; {top}"
                  + (f" (dropped config keys: {dropped})" if dropped else ""))
    if opts.json:
        atomic_write(opts.json, json.dumps(results, indent=1))
    return 0

