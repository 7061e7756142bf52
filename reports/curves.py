"""The survival curves of a report (:class:`~reports.model.CurveSummary`) from their records.

Every value is copied from the curve record (``curves/<name>.json``,
:class:`studyfiles.fit_records.CurveRecord`): the curve, its interval, the
pooled counts and, for a private curve, each point's noise share and the
privacy facts the fit released (noise multiplier, noise per count, epsilon
spent per site).
"""

from __future__ import annotations

from reports.model import CurveGroup, CurvePoint, CurveSummary
from studyfiles.fit_records import CurveFitRecord


def curve_summary(curve: CurveFitRecord) -> CurveSummary:
    """The report's view of one recorded Kaplan–Meier fit."""
    result = curve.result
    groups = []
    for group in result.groups:
        shares = (result.noise_share or {}).get(group) or [None] * len(result.grid)
        points = tuple(
            CurvePoint(time, s, low, high, n, d, share)
            for time, s, low, high, n, d, share in zip(
                result.grid,
                result.survival[group],
                result.lower[group],
                result.upper[group],
                result.at_risk[group],
                result.events[group],
                shares,
                strict=True,
            )
        )
        groups.append(CurveGroup(group, result.median[group], points))
    return CurveSummary(
        name=curve.name,
        description=curve.description,
        private=result.private,
        interval_method=result.interval_method,
        utility_warnings=tuple(result.utility_warnings),
        alpha=result.alpha,
        groups=tuple(groups),
        secure_aggregation=result.secure_aggregation,
        noise_multiplier=result.noise_multiplier,
        noise_sd_per_count=result.noise_sd_per_count,
        epsilon_spent=None if result.epsilon_spent is None else dict(result.epsilon_spent),
        n_obs=None if result.private else dict(result.n_obs),
        truncated=None if result.private else dict(result.truncated),
    )
