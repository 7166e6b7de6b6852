"""Fitting the config-selection rule to measurements over a grid of shapes (pure: plain data in and out).

The measure phase (``mamba2_guard.selection``, on a GPU) times, at every shape key of a designed grid, each
config stored for the kernel at any key: how well a config tuned at one key transfers to another (the
"measure" step of Helion's ahead-of-time heuristics). From that matrix this module

  * picks the best config at each grid key (kept in the config file like a tuned one), and
  * fits the kernel's ``Weights``, the nearest-key rule of ``mamba2_kernels.config_store``: among a small grid of
    weights, the one whose leave-one-out choice (each grid key in turn left out, the nearest remaining key's
    config used there) loses the least time against the best config measured there, as a geometric mean.

Ties keep the default weights, so a kernel whose configs all transfer equally keeps the documented rule.

It also fits each fused state pass's chain rule (``mamba2_kernels.config_store.ChainRule``) to whole calls timed
with the stage forced fused and forced chained at every grid shape: the rule with the least regret, fused
everywhere on a tie; and the fuse rule (``FuseRule``) of each fusion
(``mamba2_kernels.ssd.forcing.FUSE_STAGES``) the same way, the chain everywhere on a tie.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# The weights tried: each of the four from a small ladder. The least flag weight lets a kernel say flags hardly
# matter, yet still breaks ties: at 0, keys that differ in flags alone would tie and be ranked by their text.
WEIGHT_LADDER = {"flag": (0.05, 0.25, 1.0, 4.0), "tile": (0.5, 2.0, 8.0), "size": (0.125, 0.5, 2.0),
                 "headdim": (0.5, 2.0, 8.0)}
DEFAULT_WEIGHTS = {"flag": 1.0, "tile": 2.0, "size": 0.5, "headdim": 8.0}  # mamba2_kernels.config_store.Weights()
# The rule's distance between two key texts under weights: mamba2_kernels.config_store's, handed in by the caller.
Distance = Callable[[str, str, Mapping[str, float]], float]


@dataclass(frozen=True)
class Measured:
    """One kernel at one grid key: the median milliseconds of each candidate, named by the stored key whose
    config it is (a candidate that failed to compile or run is absent), and ``aliases``: each other stored key
    whose config became the same candidate at this key -> that candidate's name."""

    kernel: str
    key: str
    ms: Mapping[str, float]
    aliases: Mapping[str, str] = field(default_factory=dict)

    def best(self) -> str:
        return min(sorted(self.ms), key=lambda source: self.ms[source])

    def time_of(self, source: str) -> float | None:
        """The milliseconds of the config stored at ``source`` here, under its own name or its alias's."""
        return self.ms.get(self.aliases.get(source, source))


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

    def describe(self) -> str:
        return (f"{self.kernel}: weights {self.weights} from {self.fitted_on} grid keys, leave-one-out regret "
                f"{self.regret:.3f} (default weights: {self.default_regret:.3f})")


@dataclass(frozen=True)
class PathMeasured:
    """One fused stage at one grid shape: the whole call's median milliseconds with the stage run fused and
    run as its chain, and the shape's chunk size and state elements (a chain rule's inputs) and heads per
    group (a fuse rule's)."""

    stage: str
    chunk_size: int
    state: int
    fused_ms: float
    chain_ms: float
    heads_per_group: int = 0


@dataclass(frozen=True)
class ChainFit:
    stage: str
    rule: dict[str, int] | None  # min_chunk, max_state; None: the fused kernel everywhere
    fitted_on: int
    regret: float  # geometric mean of chosen / best time over the grid, with this rule
    fused_regret: float  # the same with the fused kernel everywhere

    def selection_entry(self) -> dict[str, int] | None:
        return None if self.rule is None else {**self.rule, "fitted_on": self.fitted_on}

    def describe(self) -> str:
        chosen = ("fused everywhere" if self.rule is None else
                  f"chain at chunk >= {self.rule['min_chunk']} and state <= {self.rule['max_state']}")
        return (f"{self.stage}: {chosen}, from {self.fitted_on} grid shapes, regret {self.regret:.3f} "
                f"(fused everywhere: {self.fused_regret:.3f})")


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
            ms = row.time_of(source)
            if ms is not None:
                logs.append(math.log(ms / row.ms[row.best()]))
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


@dataclass(frozen=True)
class FuseFit:
    stage: str
    rule: dict[str, int] | None  # max_heads_per_group; None: the chain everywhere
    fitted_on: int
    regret: float  # geometric mean of chosen / best time over the grid, with this rule
    chain_regret: float  # the same with the chain everywhere

    def selection_entry(self) -> dict[str, int] | None:
        return None if self.rule is None else {**self.rule, "fitted_on": self.fitted_on}

    def describe(self) -> str:
        chosen = ("chain everywhere" if self.rule is None else
                  f"fused at heads per group <= {self.rule['max_heads_per_group']}")
        return (f"{self.stage}: {chosen}, from {self.fitted_on} grid shapes, regret {self.regret:.3f} "
                f"(chain everywhere: {self.chain_regret:.3f})")


def path_regret(rows: list[PathMeasured], chains: Callable[[PathMeasured], bool]) -> float:
    """Geometric mean over ``rows`` of the time of the path picked (the chain where ``chains``) over the
    faster path's."""
    logs = [math.log((row.chain_ms if chains(row) else row.fused_ms) / min(row.chain_ms, row.fused_ms))
            for row in rows]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def chain_regret(rows: list[PathMeasured], rule: Mapping[str, int] | None) -> float:
    """``path_regret`` of a chain rule (None: the fused kernel everywhere)."""
    return path_regret(rows, lambda row: rule is not None and row.chunk_size >= rule["min_chunk"]
                       and row.state <= rule["max_state"])


def _one_stage(rows: list[PathMeasured], what: str) -> None:
    if not rows:
        raise ValueError(f"{what}: no measurements")
    stages = {row.stage for row in rows}
    if len(stages) != 1:
        raise ValueError(f"{what}: expected one stage's measurements, got {sorted(stages)}")


def fit_fuse(rows: list[PathMeasured]) -> FuseFit:
    """The fuse rule with the least regret over one stage's ``rows``: fused at heads per group up to a
    measured value; the chain everywhere (no rule) wins ties."""
    _one_stage(rows, "fit_fuse")

    def picks(rule: Mapping[str, int] | None) -> float:
        return path_regret(rows, lambda row: rule is None or row.heads_per_group > rule["max_heads_per_group"])

    best_rule, best_regret = None, picks(None)
    chain_everywhere = best_regret
    for bound in sorted({row.heads_per_group for row in rows}):
        rule = {"max_heads_per_group": bound}
        regret = picks(rule)
        if regret < best_regret - 1e-9:
            best_rule, best_regret = rule, regret
    return FuseFit(stage=rows[0].stage, rule=best_rule, fitted_on=len(rows), regret=best_regret,
                   chain_regret=chain_everywhere)


def fit_chain(rows: list[PathMeasured]) -> ChainFit:
    """The chain rule with the least regret over one stage's ``rows``. Candidate thresholds lie at the geometric
    midpoints between measured state sizes (and at the largest), so a shape between two grid shapes takes the
    path of the nearer in log scale; the fused kernel everywhere wins ties."""
    _one_stage(rows, "fit_chain")
    best_rule, best_regret = None, chain_regret(rows, None)
    fused_regret = best_regret
    for min_chunk in sorted({row.chunk_size for row in rows}, reverse=True):
        states = sorted({row.state for row in rows if row.chunk_size >= min_chunk})
        thresholds = [math.isqrt(a * b) for a, b in itertools.pairwise(states)] + states[-1:]
        for max_state in thresholds:
            rule = {"min_chunk": min_chunk, "max_state": max_state}
            regret = chain_regret(rows, rule)
            if regret < best_regret - 1e-9:
                best_rule, best_regret = rule, regret
    return ChainFit(stage=rows[0].stage, rule=best_rule, fitted_on=len(rows), regret=best_regret,
                    fused_regret=fused_regret)
