"""``mamba2-guard dev record-results``: write bench results made elsewhere (a GPU runner, a lent machine whose
checkout is thrown away) into this checkout's baselines, as ``bench --update-baseline`` would have there.

Each result goes into ``baselines/<slug of its GPU>.yaml``; rows of other kernels and shapes keep theirs. The
result files themselves belong in ``baselines/runs/`` while a row cites them (``docs/results/build.py`` names
each row's file by its ``recorded_at``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mamba2_guard.flows import baselines


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    results = [(path, baselines.read_result(path)) for path in args.results]  # every file checked before any is written
    for path, result in results:
        baseline = baselines.path_for_result(result, Path(args.root) / "baselines")
        left_out = baselines.update(baseline, result)
        cases = len(result.cases) - len(left_out)
        print(f"{path}: {cases} case(s) into {baseline}" + (f"; left out: {', '.join(left_out)}" if left_out else ""))
    print("then regenerate the results page: python docs/results/build.py")
    return 0
