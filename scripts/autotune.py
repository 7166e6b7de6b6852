"""Superseded by ``mamba2-guard autotune`` (child processes with hard timeouts, resume from a journal,
validation of every winner against the committed config, sharding over the GPUs). Kept as a shim:

    python scripts/autotune.py --kernels chunk_state --shapes nemotron3-nano --effort quick --seed 1234

is ``mamba2-guard autotune`` with the same arguments.
"""

from __future__ import annotations

import sys

from guard.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["autotune", *sys.argv[1:]]))
