"""Each iterative exact task's path rule: where its fits start and how they step.

One table both sides read: the coordinator's fits step with these rules
(:mod:`fedstats.models`), and a site that verifies paths re-derives every
requested point with the same rule before it reads a row
(:mod:`fedstats.site.verified_paths`).
"""

from __future__ import annotations

from fedstats.contract.paths import DampedNewtonPath, NewtonPath

FAIR_PATH = DampedNewtonPath(
    evaluation="tpr-parity", max_trials=30, armijo=1e-4, warm_start="gamma"
)
"""A TPR-parity penalised logistic fit (:mod:`fedstats.contract.fairness`): Newton steps on the
penalised objective with Armijo backtracking (at most 30 trials), each fit along the penalty
free to start where the previous one ended."""

PATH_RULES: dict[str, NewtonPath] = {
    "logistic.summaries": NewtonPath(),
    "glm.summaries": DampedNewtonPath(restart="rates"),
    "cox.summaries": DampedNewtonPath(),
    "cox.grid_summaries": DampedNewtonPath(evaluation="cox-grid"),
    "fairness.summaries": FAIR_PATH,
}
"""The tasks a site that verifies paths answers only on a verified path, and each one's rule."""
