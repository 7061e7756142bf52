"""The survival curves of a report (:class:`~reports.model.CurveSummary`) from their records.

Every value is copied from the curve record (``curves/<name>.json``,
:class:`studyfiles.fit_records.CurveRecord`): the curve, its interval, the
pooled counts and, for a private curve, each point's noise share and the
privacy facts the fit released (noise multiplier, noise per count, epsilon
spent per site). A value the fit did not release as a pooled estimate (some
site's counts stop earlier, at its safe horizon) is a point marked not
released, with the sites and horizons that stop its group.
"""

from __future__ import annotations

from reports.model import CurveGroup, CurvePoint, CurveSummary
from studyfiles.fit_records import CurveFitRecord, CurveRecord


def curve_summary(curve: CurveFitRecord) -> CurveSummary:
    """The report's view of one recorded Kaplan–Meier fit."""
    result = curve.result
    groups = []
    for group in result.groups:
        shares = (result.noise_share or {}).get(group) or [None] * len(result.grid)
        points = tuple(
            CurvePoint(time, s, low, high, n, d, share, released)
            for time, s, low, high, n, d, share, released in zip(
                result.grid,
                result.survival[group],
                result.lower[group],
                result.upper[group],
                result.at_risk[group],
                result.events[group],
                shares,
                result.released_at(group),
                strict=True,
            )
        )
        first = (result.not_released_from or {}).get(group)
        groups.append(
            CurveGroup(group, result.median[group], points, first, _stops(result, group, first))
        )
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
        horizon_warnings=tuple(result.horizon_warnings),
        horizons=None if result.horizons is None else dict(result.horizons),
    )


def _stops(
    result: CurveRecord, group: str, first: float | None
) -> tuple[tuple[str, float | None], ...]:
    """The sites whose counts for ``group`` stop before ``first``, with their horizons."""
    if first is None or result.horizons is None:
        return ()
    return tuple(
        (site, by_group[group])
        for site, by_group in result.horizons.items()
        if by_group[group] is None or by_group[group] < first
    )
