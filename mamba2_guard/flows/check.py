"""``check``: verdicts for a bench result against its baseline and history, with flagged cases re-run
(confirmation) before a regression is declared."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mamba2_guard.adapters.history import History
from mamba2_guard.core.results import Baseline, BenchResult, CaseResult
from mamba2_guard.core.verdicts import Policy, Verdict, check, combine, judge, needs_confirmation

Rerun = Callable[[CaseResult], CaseResult]


def run_check(result: BenchResult, baseline: Baseline | None, history: History | None, policy: Policy,
              rerun: Rerun | None = None, before_run: int | None = None) -> tuple[BenchResult, list[Verdict]]:
    """Returns the result (with confirming re-runs recorded in the cases' ``extra``) and the verdicts.
    ``before_run``: the result's own run in the history, when it is there already (a second check of it):
    the window then holds the runs before it, as at its first check, not the result itself."""
    fp = result.fingerprint_hash

    def window(kernel: str, shape: str):
        size = policy.for_case(kernel, shape).history_size
        return history.window(kernel, shape, fp, size, before_run=before_run) if history is not None else []

    verdicts = check(result, baseline, window, policy)
    if rerun is None:
        return result, verdicts
    cases = list(result.cases)
    for i, verdict in enumerate(verdicts):
        if not needs_confirmation(verdict):
            continue
        case = cases[i]
        again = rerun(case)
        second = judge(again, baseline.get(case.kernel, case.shape) if baseline else None,
                       window(case.kernel, case.shape), policy, fingerprint_hash=fp)
        verdicts[i] = combine(verdict, second)
        cases[i] = dataclasses.replace(case, extra={**case.extra, "confirmation": again.to_dict()})
    return dataclasses.replace(result, cases=tuple(cases)), verdicts
