"""Developer tools behind ``mamba2-guard dev``: sweep, sass, calibrate, module-bench, restamp, record-results,
measure-selection, warm, first-call, kernel-times, selected.

Each tool's code is a ``function(args, parser)`` in a ``mamba2_guard.dev`` module; its arguments are declared
here, so that the CLI's one parser knows them without importing the tools (``sass`` changes the Triton
environment at import, the others import torch).
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

from mamba2_guard.adapters import files
from mamba2_guard.core import flags


def _output_file(text: str) -> Path:
    return Path(files.creatable_file(text))


def _output_directory(text: str) -> Path:
    return Path(files.creatable_directory(text))


def sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev sweep`` ."""
    parser.add_argument("spec", type=Path, help="JSON list of jobs (see the module docstring)")
    parser.add_argument("--out", type=_output_file, required=True, help="results JSON, rewritten after each shape")
    parser.add_argument("--rounds", type=flags.integer(1), default=30, help="timed samples per config (default 30)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: Triton's interpreter, no timing (default cuda)")
    parser.add_argument("--no-precision", action="store_true", help="skip the outputs' comparison")


def sass_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev sass`` ."""
    parser.add_argument("entries", nargs="+", metavar="ENTRY", help="registry entry names")
    parser.add_argument("--shape", default="nemotron3-nano", help="suite shape (default nemotron3-nano)")
    parser.add_argument("--seqlen", type=flags.integer(1), default=512,
                        help="shorter sequence for the CPU capture (default 512); the configs are looked up "
                             "by key, so a shorter one finds the shape's own through the nearest-key rule")
    parser.add_argument("--gpu-slug", type=flags.gpu_slug,
                        default="nvidia-h200", help="whose configs (default nvidia-h200)")
    parser.add_argument("--arch", type=flags.integer(1), default=90, help="compute capability x 10 (default 90: sm_90)")
    parser.add_argument("--out", type=_output_directory, help="also write each kernel's Triton code, PTX and SASS here")
    parser.add_argument("--json", type=_output_file, help="write the reports as JSON")


def calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev calibrate`` ."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--suite", help="shape suite from mamba2_kernels/suites.yaml")
    where.add_argument("--shapes", nargs="+", help="shape names (default: nemotron3-nano)")
    parser.add_argument("--kernels", nargs="+", help="registry entries (default: all with a Helion kernel)")
    parser.add_argument("--runs", type=flags.integer(1), default=20)
    parser.add_argument("--rounds", type=flags.integer(1), default=30)
    parser.add_argument("--slowdown", type=flags.fraction, default=0.05, help="fraction in (0, 1); 0 skips those runs")
    parser.add_argument("--aa-timing-only", action="store_true",
                        help="A/A runs re-time only; precision is the first bench's")
    parser.add_argument("--seed", type=flags.integer(0), default=0)
    parser.add_argument("--state-dir", type=_output_directory, default=Path("/tmp/mamba2-guard-calibration"))
    parser.add_argument("--json", type=_output_file, required=True)


def module_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev module-bench`` ."""
    parser.add_argument("--shape", required=True, help="a shape of mamba2_kernels/suites.yaml")
    parser.add_argument("--d-model", type=flags.integer(1), required=True, help="the model width (the suite has none)")
    parser.add_argument("--rounds", type=flags.integer(1), default=30)
    parser.add_argument("--seed", type=flags.integer(0), default=0)
    parser.add_argument("--out", type=_output_file, required=True, help="JSON file to write")


def restamp_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev restamp`` ."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--kernels", nargs="+", metavar="KERNEL", help="the kernels whose configs were re-validated")
    which.add_argument("--all", action="store_true", help="every source file (after re-validating every kernel)")
    parser.add_argument("--gpu-slug", type=flags.gpu_slug,
                        required=True, help="whose config file and baseline, e.g. nvidia-h200")
    parser.add_argument("--root", type=files.existing_directory, default=str(Path(__file__).resolve().parents[2]),
                        help="checkout holding mamba2_kernels/configs and baselines (default: this one)")


def record_results_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev record-results`` ."""
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULT", help="bench result JSON files")
    parser.add_argument("--root", type=files.existing_directory, default=str(Path(__file__).resolve().parents[2]),
                        help="checkout holding baselines/ (default: this one)")


def _shape_arguments(parser: argparse.ArgumentParser, suite: str, processes: bool = True) -> None:
    which = parser.add_mutually_exclusive_group()  # both given: one would be dropped without a word
    which.add_argument("--suite", default=suite, help=f"shape suite from mamba2_kernels/suites.yaml (default {suite})")
    which.add_argument("--shapes", nargs="+", metavar="SHAPE", help="shape names instead of the suite")
    if processes:
        parser.add_argument("--processes", type=flags.integer(1), default=8,
                            help="parallel compile processes (default 8)")


def measure_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev measure-selection`` ."""
    _shape_arguments(parser, "selection-grid")
    parser.add_argument("--out", type=_output_file, required=True, help="measurements, JSON lines appended per kernel")
    parser.add_argument("--rounds", type=flags.integer(1), default=10, help="timed samples per config (default 10)")
    parser.add_argument("--seed", type=flags.integer(0), default=0)
    parser.add_argument("--gpu-slug", type=flags.gpu_slug,
                        help="whose config file's configs are timed (default: this GPU's)")
    parser.add_argument("--paths-only", action="store_true",
                        help="time only the whole call with each state pass fused and chained (the chain rule's "
                             "evidence), not every stored config")


def warm_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev warm`` ."""
    _shape_arguments(parser, "default")
    parser.add_argument("--entries", nargs="+", default=["ssd_combined_fwd_bwd", "ssd_combined_fwd"],
                        help="registry entries to run once (default: the whole SSD call)")
    parser.add_argument("--baseline", action="store_true", help="also compile mamba-ssm's candidates")


def first_call_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev first-call`` ."""
    _shape_arguments(parser, "zoo-heldout", processes=False)  # one process at a time: compiles would compete
    parser.add_argument("--entries", nargs="+", default=["ssd_combined_fwd_bwd"],
                        help="registry entries whose first call is timed (default: the SSD forward + backward)")
    parser.add_argument("--sides", nargs="+", choices=["helion", "mamba_ssm"], default=["helion", "mamba_ssm"],
                        help="ours, mamba-ssm's, or both (default), each in its own fresh process")
    parser.add_argument("--empty-caches", action="store_true",
                        help="give each process new, empty Triton, Helion and Inductor caches (removed after), "
                             "as on a machine that never ran the shape (default: the environment's caches)")
    parser.add_argument("--record", action="store_true",
                        help="keep each shape's seconds in baselines/first-call/<gpu-slug>.yaml (the results "
                             "page shows them), as each shape finishes")
    parser.add_argument("--missing-only", action="store_true",
                        help="with --record: skip the shapes that file already holds for these entries and caches "
                             "(rerun a command cut short to measure the rest)")


def kernel_times_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev kernel-times`` ."""
    _shape_arguments(parser, "zoo-heldout", processes=False)
    parser.add_argument("--entry", default="ssd_combined_fwd_bwd", help="a whole call's registry entry "
                        "(default ssd_combined_fwd_bwd)")
    parser.add_argument("--calls", type=flags.integer(1), default=10, help="profiled calls (default 10)")
    parser.add_argument("--seed", type=flags.integer(0), default=0)
    parser.add_argument("--out", type=_output_file, help="also write the rows as JSON")


def selected_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``mamba2-guard dev selected`` ."""
    _shape_arguments(parser, "zoo-heldout", processes=False)
    parser.add_argument("--entries", nargs="+", default=["ssd_combined_fwd_bwd", "mamba2_layer_fwd_bwd"],
                        help="whole calls' registry entries (default: the SSD call's and the layer's forward + "
                             "backward)")
    parser.add_argument("--gpu-slug", type=flags.gpu_slug,
                        default="nvidia-h200", help="whose config file (default nvidia-h200)")
    parser.add_argument("--against", type=Path, help="another config file: name the launches that select "
                        "another config from it (e.g. the file before a re-tune)")
    parser.add_argument("--seqlen", type=flags.integer(1),
                        help="the CPU run's sequence length (default: two chunks); keys take the shape's own tokens")
    parser.add_argument("--processes", type=flags.integer(1), default=os.cpu_count() or 1,
                        help="parallel processes, one (shape, call) each (default: the CPU count)")
    parser.add_argument("--out", type=_output_file, help="also write the selections as JSON")


# name -> ("module:function", argument declarations, one-line help)
TOOLS = {
    "sweep": ("mamba2_guard.dev.sweep:run", sweep_arguments,
              "hand-picked configs against the stored ones, timed on the GPU"),
    "sass": ("mamba2_guard.dev.sass:run", sass_arguments,
             "SASS of an entry's kernels, compiled offline with the stored configs"),
    "calibrate": ("mamba2_guard.dev.calibrate:run", calibrate_arguments,
                  "measure the regression rule on a GPU: A/A false alarms, detection of an injected slowdown"),
    "module-bench": ("mamba2_guard.dev.module_bench:run", module_bench_arguments,
                     "the full mamba-ssm Mamba2 module, GEMMs included, on mamba-ssm's kernels and on ours"),
    "restamp": ("mamba2_guard.dev.restamp:run", restamp_arguments,
                "record the current sources of re-validated kernels in a GPU's config file and baseline"),
    "record-results": ("mamba2_guard.dev.record_results:run", record_results_arguments,
                       "write bench results made elsewhere into this checkout's baselines"),
    "measure-selection": ("mamba2_guard.dev.measure_selection:measure", measure_selection_arguments,
                          "time every stored config at each grid shape's keys, and each state pass fused and "
                          "chained, for the selection rule's fit"),
    "warm": ("mamba2_guard.dev.measure_selection:warm", warm_arguments,
             "precompile the configs the runtime selects at a suite's shapes (a job's cold start)"),
    "first-call": ("mamba2_guard.dev.measure_selection:first_call", first_call_arguments,
                   "seconds of the first call at each shape in a fresh process, ours and mamba-ssm's"),
    "kernel-times": ("mamba2_guard.dev.kernel_times:run", kernel_times_arguments,
                     "a whole call's device time kernel by kernel at each shape, ours and mamba-ssm's"),
    "selected": ("mamba2_guard.dev.selected_configs:run", selected_arguments,
                 "the config each launch of a whole call selects from a GPU's config file, no GPU needed; "
                 "with --against, the launches a config change moves"),
}


def require_gpu(parser: argparse.ArgumentParser, why: str) -> None:
    """One line and exit 2 where there is no CUDA GPU; ``why`` says what the tool needs it for. Tools call it
    after checking their names, so that an unknown one is reported on any machine."""
    import torch

    if not torch.cuda.is_available():
        parser.error(f"needs a CUDA GPU: {why}")


def register(sub: argparse._SubParsersAction) -> None:
    """``mamba2-guard dev <tool> ...`` under the CLI's subcommands ``sub``."""
    text = "developer tools: " + " | ".join(TOOLS)
    dev = sub.add_parser("dev", help=text, description=text[0].upper() + text[1:] + ".")
    tools = dev.add_subparsers(dest="tool", required=True, metavar="TOOL")
    for name, (target, arguments, text) in TOOLS.items():
        p = tools.add_parser(name, help=text, description=text)
        arguments(p)
        module, function = target.split(":")
        p.set_defaults(func=lambda args, module=module, function=function, p=p: getattr(
            importlib.import_module(module), function)(args, p))
