"""mamba2-guard: the CLI and daemon that keep the Helion Mamba-2 kernels fast and correct.

``mamba2_guard`` imports ``mamba2_kernels``; ``mamba2_kernels`` never imports ``mamba2_guard``.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.2.1"

# A daemon cycle that found its state dir held by another cycle (a CLI nightly): skipped (EX_TEMPFAIL).
EXIT_BUSY = 75


# The daemon's defaults, here rather than in ``mamba2_guard.daemon``, whose scheduler and job store (APScheduler,
# SQLAlchemy) every command's parser would otherwise import to show them in ``daemon --help``.
DEFAULT_NIGHTLY_CRON = "17 3 * * *"
DEFAULT_METRICS_PORT = 9466
NIGHTLY_TARGET = "mamba2_guard.flows.nightly:daemon_cycle"
DRIFT_TARGET = "mamba2_guard.daemon:probe_drift"


class EnvironmentProblem(RuntimeError):
    """The environment cannot run the guard (exit code 2)."""


PROJECT_ROOT = Path(__file__).resolve().parent.parent
