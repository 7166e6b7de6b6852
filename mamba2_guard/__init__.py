"""mamba2-guard: the CLI and daemon that keep the Helion Mamba-2 kernels fast and correct.

``mamba2_guard`` imports ``mamba2_kernels``; ``mamba2_kernels`` never imports ``mamba2_guard``.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.2.1"

# A daemon cycle that found its state dir held by another cycle (a CLI nightly): skipped (EX_TEMPFAIL).
EXIT_BUSY = 75


class EnvironmentProblem(RuntimeError):
    """The environment cannot run the guard (exit code 2)."""


PROJECT_ROOT = Path(__file__).resolve().parent.parent
