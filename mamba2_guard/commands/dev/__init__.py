"""``mamba2-guard dev <tool>``: the developer tools, one module each like the other commands (``register`` declares
the tool and its flags, ``run`` runs it). Each ``run`` imports its tool from ``mamba2_guard.dev`` only when called:
the tools import torch, and ``sass`` changes the Triton environment at import."""

from __future__ import annotations

from typing import Any

from mamba2_guard.commands.dev import (
    calibrate,
    eager_step,
    first_call,
    kernel_times,
    measure_selection,
    module_bench,
    record_results,
    restamp,
    sass,
    selected,
    sweep,
    warm,
)

# In the order `dev --help` lists them.
TOOLS = (sweep, sass, calibrate, module_bench, restamp, record_results, measure_selection, warm, first_call,
         kernel_times, selected, eager_step)


def register(commands: Any) -> None:
    """``mamba2-guard dev`` and its tools under the CLI's ``commands``."""
    text = "developer tools: " + " | ".join(tool.__name__.rsplit(".", 1)[1].replace("_", "-") for tool in TOOLS)
    dev = commands.add_parser("dev", help=text, description=text[0].upper() + text[1:] + ".")
    tools = dev.add_subparsers(dest="tool", required=True, metavar="TOOL")
    for tool in TOOLS:
        tool.register(tools)
