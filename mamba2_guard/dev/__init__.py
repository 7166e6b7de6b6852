"""Developer tools behind ``mamba2-guard dev``: sweep, sass, calibrate, module-bench, restamp, record-results,
measure-selection, warm, first-call, kernel-times, selected, eager-step.

Each tool's code is a ``function(args, parser)`` in a module of this package; its command, flags and help are
``mamba2_guard.commands.dev``'s, one module per tool.
"""

from __future__ import annotations

import argparse


def require_gpu(parser: argparse.ArgumentParser, why: str) -> None:
    """One line and exit 2 where there is no CUDA GPU; ``why`` says what the tool needs it for. Tools call it
    after checking their names, so that an unknown one is reported on any machine."""
    import torch

    if not torch.cuda.is_available():
        parser.error(f"needs a CUDA GPU: {why}")
