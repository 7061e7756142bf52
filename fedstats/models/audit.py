"""Empirical privacy audit in one training run (Steinke, Nasr & Jagielski, NeurIPS 2023).

``m`` canaries are drawn; each is put into the training data independently
with probability 1/2 (from OS entropy). After one training run, every canary
gets a membership score (higher: more likely trained on). The auditor
guesses "in" for the ``k+`` highest scores and "out" for the ``k-`` lowest
and abstains on the rest; ``v`` of its ``r = k+ + k-`` guesses are right.

For an ``(epsilon, delta)``-DP training algorithm, the number of correct
guesses is dominated by ``Binomial(r, p)`` with ``p = e^eps / (1 + e^eps)``,
up to a ``delta`` term (their Theorem 3.3 and Algorithm 2)::

    P[V >= v] <= P[Bin(r, p) >= v] + 2 m delta max_{i=1..v} P[v - i <= Bin(r, p) < v] / i

The audit's lower bound is the largest ``epsilon`` this p-value still rejects
at the chosen confidence: a guarantee "the training is not
``(epsilon, delta)``-DP for any smaller epsilon", with probability at least
the confidence over the canaries' coin flips. Guess counts are fixed before
the scores are seen; trying several counts pays a Bonferroni correction, so
the bound stays valid. With ``r`` guesses the bound cannot exceed roughly
``log(r)`` (about 4.2 at ``r = 200`` and 95 %): the audit detects missing
noise or overclaimed amplification, not small accounting errors. A
non-private control run with the same canaries shows the audit's power.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from fedstats.errors import StudyConfigurationError


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of ``v`` correct of ``r`` guesses on ``m`` canaries under (eps, delta)-DP."""
    if not 0 <= v <= r <= m:
        raise StudyConfigurationError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    p = 1.0 / (1.0 + np.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, p))
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)  # P[Bin = v-1], P[Bin = v-2], ...
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(
    m: int, r: int, v: int, delta: float, confidence: float = 0.95, tolerance: float = 1e-6
) -> float:
    """The largest epsilon rejected at ``confidence`` given ``v`` of ``r`` right (0 if none)."""
    level = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, r, v, high, delta) < level:
        low, high = high, 2 * high
        if high > 1e3:
            return low
    while high - low > tolerance:
        middle = (low + high) / 2
        if p_value(m, r, v, middle, delta) < level:
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class AuditResult:
    """The audit's figures, for the report (beside the accounted epsilon)."""

    epsilon_lower: float
    confidence: float
    delta: float
    canaries: int
    included: int
    guesses: int
    correct: int
    guess_grid: tuple[int, ...]
    accounted_epsilon: float | None = None
    private: bool = True

    def to_record(self) -> dict:
        record = asdict(self)
        record["guess_grid"] = list(self.guess_grid)
        record["method"] = "one-run canary audit (Steinke, Nasr & Jagielski, NeurIPS 2023)"
        return record


def draw_inclusion(canaries: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Which canaries go into training: independent fair coins (OS entropy by default)."""
    rng = rng if rng is not None else np.random.default_rng()
    return rng.random(canaries) < 0.5


def audit(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    guess_grid: Sequence[int],
    confidence: float = 0.95,
    accounted_epsilon: float | None = None,
    private: bool = True,
) -> AuditResult:
    """Lower-bound epsilon from canary scores; ``guess_grid`` lists the total guesses tried.

    Each ``r`` in the grid guesses ``in`` for the ``ceil(r/2)`` highest and
    ``out`` for the ``floor(r/2)`` lowest scores; the best bound over the
    grid is reported at ``confidence`` after a Bonferroni correction for the
    grid's size.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if included.shape != scores.shape or not np.all(np.isfinite(scores)):
        raise StudyConfigurationError("one finite score and one inclusion flag per canary")
    grid = tuple(int(r) for r in guess_grid)
    if not grid or any(not 1 <= r <= m for r in grid):
        raise StudyConfigurationError(f"each guess count must be in 1..{m}, got {grid}")
    per_test = 1.0 - (1.0 - confidence) / len(grid)
    order = np.argsort(-scores, kind="stable")
    best = None
    for r in grid:
        k_in, k_out = (r + 1) // 2, r // 2
        right = int(included[order[:k_in]].sum()) + int((~included[order[m - k_out :]]).sum())
        bound = epsilon_lower_bound(m, r, right, delta, per_test)
        if best is None or bound > best[0]:
            best = (bound, r, right)
    assert best is not None
    return AuditResult(
        epsilon_lower=best[0],
        confidence=confidence,
        delta=delta,
        canaries=m,
        included=int(included.sum()),
        guesses=best[1],
        correct=best[2],
        guess_grid=grid,
        accounted_epsilon=accounted_epsilon,
        private=private,
    )
