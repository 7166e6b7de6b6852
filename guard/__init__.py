"""mamba2-guard: the CLI and daemon that keep the Helion Mamba-2 kernels fast and correct.

``guard`` imports ``kernels``; ``kernels`` never imports ``guard``.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

# A daemon cycle that found its state dir held by another cycle (a CLI nightly): skipped (EX_TEMPFAIL).
EXIT_BUSY = 75


class EnvironmentProblem(RuntimeError):
    """The environment cannot run the guard (exit code 2)."""


def check_kernels_package() -> None:
    """Fail clearly if ``import kernels`` is not this project's package (Hugging Face ships one too)."""
    import kernels

    if getattr(kernels, "IS_MAMBA2_GUARD", False) is not True:
        where = getattr(kernels, "__file__", None) or list(getattr(kernels, "__path__", []))
        raise EnvironmentProblem(
            f"`import kernels` resolved to {where}, which is not mamba2-guard's kernels package. Another "
            "distribution (Hugging Face's `kernels`) uses the same import name: uninstall it "
            "(`pip uninstall kernels`) or install mamba2-guard in its own virtual environment."
        )


PROJECT_ROOT = Path(__file__).resolve().parent.parent
