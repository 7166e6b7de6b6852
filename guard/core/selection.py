"""Fitting the config-selection rule to measurements over a grid of shapes (pure: plain data in and out).

The measure phase (``guard.selection``, on a GPU) times, at every shape key of a designed grid, each
config stored for the kernel at any key: how well a config tuned at one key transfers to another (the
"measure" step of Helion's ahead-of-time heuristics). From that matrix this module

  * picks the best config at each grid key (kept in the config file like a tuned one), and
  * fits the kernel's ``Weights``, the nearest-key rule of ``kernels.config_store``: among a small grid of
    weights, the one whose leave-one-out choice (each grid key in turn left out, the nearest remaining key's
    config used there) loses the least time against the best config measured there, as a geometric mean.

Ties keep the default weights, so a kernel whose configs all transfer equally keeps the documented rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

# The weights tried: each of the three from a small ladder. 0 for flags lets a kernel say flags do not matter.
WEIGHT_LADDER = {"flag": (0.0, 0.25, 1.0, 4.0), "tile": (0.5, 2.0, 8.0), "size": (0.125, 0.5, 2.0)}
DEFAULT_WEIGHTS = {"flag": 1.0, "tile": 2.0, "size": 0.5}  # kernels.config_store.Weights()
# The rule's distance between two key texts under weights: kernels.config_store's, handed in by the caller.
Distance = Callable[[str, str, Mapping[str, float]], float]


@dataclass(frozen=True)
class Measured:
    """One kernel at one grid key: the median milliseconds of each candidate, named by the stored key whose
    config it is (a candidate that failed to compile or run is absent)."""

    kernel: str
    key: str
    ms: Mapping[str, float]

    def best(self) -> str:
        return min(sorted(self.ms), key=lambda source: self.ms[source])


@dataclass(frozen=True)
class Fit:
    kernel: str
    weights: dict[str, float]
    fitted_on: int  # grid keys
    regret: float  # leave-one-out geometric mean of chosen / best time, with the fitted weights
    default_regret: float  # the same with the default weights
    best: dict[str, str]  # grid key -> the stored key whose config was fastest there

    def selection_entry(self) -> dict[str, float | int]:
        return {**self.weights, "fitted_on": self.fitted_on, "regret": round(self.regret, 4)}


def loo_regret(rows: list[Measured], weights: Mapping[str, float], distance: Distance,
               stored: Iterable[str] = ()) -> float:
    """Leave-one-out regret of the nearest-key rule. Each left-out grid key chooses among the other grid
    keys (each standing for its best config) and the ``stored`` keys (standing for their own configs), and
    takes the nearest whose config was measured at the left-out key."""
    by_key = {row.key: row for row in rows}
    stored = [text for text in stored if text not in by_key]
    logs = []
    for row in rows:
        options = [(distance(row.key, other.key, weights), other.key, other.best())
                   for other in rows if other.key != row.key]
        options += [(distance(row.key, text, weights), text, text) for text in stored]
        for _, _, source in sorted(options):
            if source in row.ms:
                logs.append(math.log(row.ms[source] / row.ms[row.best()]))
                break
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def fit(rows: list[Measured], distance: Distance, stored: Iterable[str] = ()) -> Fit:
    """The weights of ``WEIGHT_LADDER`` with the least leave-one-out regret for one kernel's ``rows``."""
    if not rows:
        raise ValueError("fit: no measurements")
    kernels = {row.kernel for row in rows}
    if len(kernels) != 1:
        raise ValueError(f"fit: expected one kernel's measurements, got {sorted(kernels)}")
    stored = list(stored)
    best_weights, best_regret = dict(DEFAULT_WEIGHTS), loo_regret(rows, DEFAULT_WEIGHTS, distance, stored)
    default_regret = best_regret
    for values in itertools.product(*WEIGHT_LADDER.values()):
        weights = dict(zip(WEIGHT_LADDER, values, strict=True))
        regret = loo_regret(rows, weights, distance, stored)
        if regret < best_regret - 1e-9:
            best_weights, best_regret = weights, regret
    return Fit(kernel=rows[0].kernel, weights=best_weights, fitted_on=len(rows), regret=best_regret,
               default_regret=default_regret, best={row.key: row.best() for row in rows})
