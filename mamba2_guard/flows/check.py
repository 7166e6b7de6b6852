"""``check``: verdicts for a bench result against its baseline and history, with flagged cases re-run
(confirmation) before a regression is declared."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mamba2_guard.adapters.history import History
from mamba2_guard.core.results import Baseline, BenchResult, CaseResult, HistoryPoint
from mamba2_guard.core.verdicts import Policy, Verdict, check, combine, judge, needs_confirmation

Rerun = Callable[[CaseResult], CaseResult]


def history_window(history: History | None, policy: Policy, fingerprint_hash: str, before_run: int | None = None
                   ) -> Callable[[str, str], list[HistoryPoint]]:
    """The earlier runs a case is judged against: (kernel, shape) -> its history window, oldest first."""

    def window(kernel: str, shape: str) -> list[HistoryPoint]:
        size = policy.for_case(kernel, shape).history_size
        return history.window(kernel, shape, fingerprint_hash, size, before_run=before_run) if history else []

    return window


def earlier_speedups(result: BenchResult, history: History | None, policy: Policy, before_run: int | None = None
                     ) -> dict[tuple[str, str], list[float]]:
    """Each case's speedups against mamba-ssm in its history window, oldest first: the report's trend chart."""
    window = history_window(history, policy, result.fingerprint_hash, before_run)
    return {case.key: [p.speedup for p in window(case.kernel, case.shape) if p.speedup]
            for case in result.cases if case.timings_meaningful}


def run_check(result: BenchResult, baseline: Baseline | None, history: History | None, policy: Policy,
              rerun: Rerun | None = None, before_run: int | None = None) -> tuple[BenchResult, list[Verdict]]:
    """Returns the result (with confirming re-runs recorded in the cases' ``extra``) and the verdicts.
    ``before_run``: the result's own run in the history, when it is there already (a second check of it):
    the window then holds the runs before it, as at its first check, not the result itself."""
    fp = result.fingerprint_hash
    window = history_window(history, policy, fp, before_run)
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
