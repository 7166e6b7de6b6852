"""``check``: verdicts for a bench result against its baseline and history, with flagged cases re-run
(confirmation) before a regression is declared."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from mamba2_guard.adapters.history import History
from mamba2_guard.core.results import Baseline, BenchResult, CaseResult, HistoryPoint
from mamba2_guard.core.verdicts import Policy, Verdict, check, combine, judge, needs_confirmation

Rerun = Callable[[CaseResult], CaseResult]


def history_windows(result: BenchResult, history: History | None, policy: Policy, before_run: int | None = None
                    ) -> dict[tuple[str, str], list[HistoryPoint]]:
    """Each case's earlier runs, oldest first, read once: the verdicts (``run_check``) and the report's trend
    chart (``earlier_speedups``) both take them. ``before_run``: the result's own run in the history, when it
    is there already (a second check of it): the windows then hold the runs before it, as at its first check,
    not the result itself."""
    if history is None:
        return {}
    return {case.key: history.window(case.kernel, case.shape, result.fingerprint_hash,
                                     policy.for_case(case.kernel, case.shape).history_size, before_run=before_run)
            for case in result.cases}


def earlier_speedups(result: BenchResult, windows: Mapping[tuple[str, str], Sequence[HistoryPoint]]
                     ) -> dict[tuple[str, str], list[float]]:
    """Each timed case's speedups against mamba-ssm in its history window (``history_windows``), oldest first:
    the report's trend chart."""
    return {case.key: [p.speedup for p in windows.get(case.key, ()) if p.speedup]
            for case in result.cases if case.timings_meaningful}


def run_check(result: BenchResult, baseline: Baseline | None,
              windows: Mapping[tuple[str, str], Sequence[HistoryPoint]] | None, policy: Policy,
              rerun: Rerun | None = None) -> tuple[BenchResult, list[Verdict]]:
    """Returns the result (with confirming re-runs recorded in the cases' ``extra``) and the verdicts, each
    case judged against its history window (``history_windows``; None: no history)."""
    windows = windows or {}
    verdicts = check(result, baseline, windows, policy)
    if rerun is None:
        return result, verdicts
    cases = list(result.cases)
    for i, verdict in enumerate(verdicts):
        if not needs_confirmation(verdict):
            continue
        case = cases[i]
        again = rerun(case)
        second = judge(again, baseline.get(case.kernel, case.shape) if baseline else None,
                       windows.get(case.key, []), policy, fingerprint_hash=result.fingerprint_hash)
        verdicts[i] = combine(verdict, second)
        cases[i] = dataclasses.replace(case, extra={**case.extra, "confirmation": again.to_dict()})
    return dataclasses.replace(result, cases=tuple(cases)), verdicts
