"""Federated cumulative incidence of one cause among competing risks (Aalen–Johansen).

Sites release, per group and grid point, the number at risk ``n_j``, the
events of the cause of interest ``d_j`` and the events of any other cause
``c_j`` (:mod:`fedstats.site.handlers.competing`, with its disclosure rules);
the coordinator sums them over sites. On the grid's time scale (each time
coarsened up to the next grid point) these are the pooled counts, and with
``D_j = d_j + c_j`` the events of any cause:

* all-cause survival (Kaplan–Meier) ``S(g_j) = prod_{l<=j} (1 - D_l / n_l)``;
* the Aalen–Johansen cumulative incidence of the cause (Aalen & Johansen,
  Scand J Stat 1978; Kalbfleisch & Prentice, 2002, section 8.2.2)
  ``F(g_j) = sum_{l<=j} S(g_{l-1}) d_l / n_l``;
* its delta-method (Greenwood-type) variance (Marubini & Valsecchi, 1995,
  section 10.2; Collett, *Modelling Survival Data in Medical Research*, 3rd
  ed., p. 411; SAS PROC LIFETEST; lifelines' ``AalenJohansenFitter``)
  ``Var F(t) = sum_{l: g_l<=t} (F(t) - F(g_l))^2 D_l / (n_l (n_l - D_l))
  + S(g_{l-1})^2 d_l (n_l - d_l) / n_l^3
  - 2 (F(t) - F(g_l)) S(g_{l-1}) d_l / n_l^2``
  (the first term is 0 where everyone at risk fails, as in Greenwood's);
* Gray's variance, what R's ``cmprsk::cuminc`` reports as ``var`` (Gray, Ann Stat
  1988, 16:1141–1154): the same expansion of ``F(t)`` in the hazard increments
  ``h_{k,l} = d_{k,l} / n_l`` of each cause ``k``, each with variance
  ``v_{k,l} = d_{k,l} (n_l - d_{k,l}) / (n_l^2 (n_l - 1))`` (``d_{k,l} / n_l^2`` where
  ``n_l = 1``) and the causes' increments uncorrelated:
  ``Var F(t) = sum_{l: g_l<=t} (F(t) - F(g_l))^2 (v_{1,l} + v_{2,l}) / (1 - D_l/n_l)^2
  + S(g_{l-1})^2 v_{1,l} - 2 (F(t) - F(g_l)) S(g_{l-1}) v_{1,l} / (1 - D_l/n_l)``
  (cause 1 the cause of interest, 2 every other; the terms with ``1 - D_l/n_l = 0``
  are 0, as ``F`` no longer changes);
* the interval on the ``log(-log F)`` scale, which stays inside (0, 1):
  ``exp(-exp(log(-log F) -/+ z se))`` with ``se = sqrt(Var F) / (F |log F|)``, from the
  delta-method variance by default or Gray's (``variance="gray"``).

With a grid holding every distinct follow-up time (allowed only when the
disclosure threshold is 1) the results are those of the pooled data. Each
site ends its counts at its safe horizon (patients followed longer censored
there, reported per site).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from fedstats.contract.design import Level, normalise_level
from fedstats.contract.tasks.competing import MAX_CAUSE, TASK
from fedstats.errors import StudyConfigurationError
from fedstats.models.agree import agreed_levels
from fedstats.models.federation import Federation
from fedstats.models.kaplan_meier import step_curves, time_grid
from fedstats.models.secure_aggregation import SecureAggregation, summed_replies
from fedstats.models.summary import Summary, render_html, render_summary


def checked_cause(cause: object) -> int:
    """The cause of interest: a positive integer status code."""
    if not (type(cause) is int and 1 <= cause <= MAX_CAUSE):
        raise StudyConfigurationError(
            f"cause must be a positive integer status code (1 to {MAX_CAUSE}; 0 means "
            f"censored), got {cause!r}"
        )
    return cause


def aalen_johansen(
    at_risk: np.ndarray, events: np.ndarray, competing: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative incidence and its delta-method variance per group and grid point.

    Along the last axis (the grid); NaN once nobody is left at risk. See the
    module docstring for the formulas.
    """
    n, d, D = at_risk, events, events + competing
    with np.errstate(divide="ignore", invalid="ignore"):
        hazard = np.where(n > 0, d / n, 0.0)
        survival = np.cumprod(np.where(n > 0, 1.0 - D / n, 1.0), axis=-1)
        lagged = np.concatenate([np.ones_like(survival[..., :1]), survival[..., :-1]], axis=-1)
        incidence = np.cumsum(lagged * hazard, axis=-1)
        a = np.where((n > 0) & (n > D), D / (n * (n - D)), 0.0)
        b = np.where(n > 0, lagged**2 * d * (n - d) / n**3, 0.0)
        c = np.where(n > 0, lagged * d / n**2, 0.0)
    F = incidence
    first = (
        F**2 * np.cumsum(a, axis=-1)
        - 2 * F * np.cumsum(a * F, axis=-1)
        + np.cumsum(a * F**2, axis=-1)
    )
    third = F * np.cumsum(c, axis=-1) - np.cumsum(c * F, axis=-1)
    variance = np.maximum(first + np.cumsum(b, axis=-1) - 2 * third, 0.0)
    gone = np.cumsum(n[..., ::-1] > 0, axis=-1)[..., ::-1] == 0
    incidence = np.where(gone, np.nan, incidence)
    variance = np.where(gone, np.nan, variance)
    return incidence, variance


def gray_variance(at_risk: np.ndarray, events: np.ndarray, competing: np.ndarray) -> np.ndarray:
    """Gray's variance of the cumulative incidence per group and grid point, as
    ``cmprsk::cuminc``'s ``var`` (module docstring; Gray 1988). Along the last axis (the grid);
    NaN once nobody is left at risk."""
    n, d, e = at_risk, events, competing
    D = d + e
    with np.errstate(divide="ignore", invalid="ignore"):
        hazard = np.where(n > 0, d / n, 0.0)
        survival = np.cumprod(np.where(n > 0, 1.0 - D / n, 1.0), axis=-1)
        lagged = np.concatenate([np.ones_like(survival[..., :1]), survival[..., :-1]], axis=-1)
        F = np.cumsum(lagged * hazard, axis=-1)

        def increment(count: np.ndarray) -> np.ndarray:
            """The variance of one cause's hazard increment ``count / n``."""
            spread = np.where(n > 1, (n - count) / (n - 1), 1.0)
            return np.where(n > 0, count / n**2 * spread, 0.0)

        own = increment(d)
        left = np.where(n > D, 1.0 - D / n, 0.0)
        a = np.where(left > 0, (own + increment(e)) / left**2, 0.0)
        c = np.where(left > 0, lagged * own / left, 0.0)
    first = (
        F**2 * np.cumsum(a, axis=-1)
        - 2 * F * np.cumsum(a * F, axis=-1)
        + np.cumsum(a * F**2, axis=-1)
    )
    third = F * np.cumsum(c, axis=-1) - np.cumsum(c * F, axis=-1)
    variance = np.maximum(first + np.cumsum(lagged**2 * own, axis=-1) - 2 * third, 0.0)
    gone = np.cumsum(n[..., ::-1] > 0, axis=-1)[..., ::-1] == 0
    return np.where(gone, np.nan, variance)


VARIANCES = ("delta", "gray")
"""The variances a cumulative incidence's intervals may use: the delta method's (lifelines'
``AalenJohansenFitter``) or Gray's (``cmprsk::cuminc``)."""


def loglog_interval(
    incidence: np.ndarray, variance: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on the ``log(-log F)`` scale (0 and 0 where ``F`` is 0)."""
    z = stats.norm.ppf(1 - alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        loglog = np.log(-np.log(incidence))
        se = np.sqrt(variance) / (incidence * np.abs(np.log(incidence)))
        lower = np.exp(-np.exp(loglog + z * se))
        upper = np.exp(-np.exp(loglog - z * se))
    lower = np.where(incidence == 0, 0.0, lower)
    upper = np.where(incidence == 0, 0.0, upper)
    return lower, upper


class CumulativeIncidence:
    """Federated Aalen–Johansen cumulative incidence of one cause, overall or by group.

    Parameters
    ----------
    time, event:
        Follow-up time (>= 0) and status columns: 0 = censored, 1, 2, ... =
        the cause that ended follow-up.
    cause:
        The cause of interest (a positive status code); every other positive
        code is a competing event.
    group, levels:
        Optional grouping column; its levels are agreed across sites (or given).
    grid, width, horizon:
        The shared time grid, as for :class:`fedstats.KaplanMeier`.
    alpha:
        ``1 - alpha`` confidence intervals.
    variance:
        The variance behind the intervals and the standard errors of ``to_frame()``:
        ``"delta"`` (default; the delta-method variance of lifelines'
        ``AalenJohansenFitter``) or ``"gray"`` (Gray's, R's ``cmprsk::cuminc(...)$var``).
        Both are always computed (``variance_`` and ``gray_variance_``).

    Examples
    --------
    >>> cif = CumulativeIncidence("t", "status", cause=1, width=30, horizon=720)  # doctest: +SKIP
    >>> cif.fit(fed).cumulative_incidence_  # doctest: +SKIP
    """

    def __init__(
        self,
        time: str,
        event: str,
        *,
        cause: int,
        group: str | None = None,
        levels: Sequence[Level] | None = None,
        grid: Sequence[float] | np.ndarray | None = None,
        width: float | None = None,
        horizon: float | None = None,
        alpha: float = 0.05,
        variance: str = "delta",
    ) -> None:
        if not 0 < alpha < 1:
            raise StudyConfigurationError(f"alpha must be in (0, 1), got {alpha}")
        if not (isinstance(variance, str) and variance in VARIANCES):
            raise StudyConfigurationError(
                f"variance must be one of {VARIANCES} ('delta': lifelines' AalenJohansenFitter; "
                f"'gray': cmprsk::cuminc), got {variance!r}"
            )
        self.variance = variance
        self.time, self.event, self.group = time, event, group
        self.cause = checked_cause(cause)
        self.levels = list(levels) if levels is not None else None
        self.grid = time_grid(grid, width, horizon)
        self.alpha = alpha

    def fit(
        self, federation: Federation, secure_aggregation: SecureAggregation | None = None
    ) -> CumulativeIncidenceResults:
        """Pool the sites' counts on the grid and compute the curves; with
        ``secure_aggregation`` the coordinator sees only the counts summed over sites (and the
        patients censored early only in total)."""
        analysis = federation.new_analysis("cumulative_incidence")
        groups: tuple[Level, ...] = ()
        if self.group is not None:
            if self.levels is not None:
                groups = tuple(normalise_level(v) for v in self.levels)
                if not groups:
                    raise StudyConfigurationError(f"no levels given for {self.group!r}")
            else:
                groups = agreed_levels(federation, self.group, analysis)
        args = {
            "time": self.time,
            "event": self.event,
            "cause": self.cause,
            "group": self.group,
            "levels": list(groups),
            "grid": self.grid,
        }
        if secure_aggregation is not None:
            total = summed_replies(
                federation, TASK, args, analysis=analysis, secure=secure_aggregation
            )
            counts = {f: np.rint(total[f]) for f in ("at_risk", "events", "competing")}
            truncated = {"all sites": round(total["truncated"])}
            n_obs = {"all sites": round(total["n_obs"])}
        else:
            replies = federation.request(TASK, args, analysis=analysis)
            counts = {
                f: sum(r[f] for r in replies.values()) for f in ("at_risk", "events", "competing")
            }
            truncated = {s: int(r["truncated"]) for s, r in replies.items()}
            n_obs = {s: int(r["n_obs"]) for s, r in replies.items()}
        return CumulativeIncidenceResults(
            grid=self.grid,
            groups=groups if self.group is not None else ("all",),
            cause=self.cause,
            **counts,
            truncated=truncated,
            n_obs=n_obs,
            sites=len(federation.sites),
            secure=secure_aggregation is not None,
            alpha=self.alpha,
            variance=self.variance,
        )


class CumulativeIncidenceResults:
    """Cumulative incidence curves of one cause on the grid, by group, with intervals.

    Attributes
    ----------
    cumulative_incidence_:
        ``F(t)`` per grid time (rows) and group (columns).
    variance_:
        The delta-method variance of ``F(t)`` (module docstring): lifelines'
        ``AalenJohansenFitter(calculate_variance=True).variance_``.
    gray_variance_:
        Gray's variance of ``F(t)`` (module docstring): R's ``cmprsk::cuminc(...)$var``
        (``timepoints(cuminc(time, status, group, cencode = 0), grid)$var``).
    confidence_interval_:
        ``{"lower": ..., "upper": ...}``, on the ``log(-log F)`` scale, from the variance the
        fit asked for (``variance="delta"`` or ``"gray"``).
    """

    def __init__(
        self,
        *,
        grid: np.ndarray,
        groups: tuple[Level, ...],
        cause: int,
        at_risk: np.ndarray,
        events: np.ndarray,
        competing: np.ndarray,
        truncated: dict[str, int],
        n_obs: dict[str, int],
        alpha: float,
        sites: int,
        secure: bool = False,
        variance: str = "delta",
    ) -> None:
        self.grid, self.groups, self.cause, self.alpha = grid, groups, cause, alpha
        self.sites, self.secure = sites, secure
        self.at_risk, self.events, self.competing = at_risk, events, competing
        self.truncated, self.n_obs = truncated, n_obs
        index = pd.Index(grid, name="time")
        columns = list(groups)
        incidence, delta = aalen_johansen(at_risk, events, competing)
        gray = gray_variance(at_risk, events, competing)
        self.variance = variance
        chosen = gray if variance == "gray" else delta
        lower, upper = loglog_interval(incidence, chosen, alpha)
        frame = lambda values: pd.DataFrame(values.T, index=index, columns=columns)  # noqa: E731
        self.cumulative_incidence_ = frame(incidence)
        self.variance_ = frame(delta)
        self.gray_variance_ = frame(gray)
        self.confidence_interval_ = {"lower": frame(lower), "upper": frame(upper)}

    @property
    def event_table(self) -> pd.DataFrame:
        """Pooled ``at_risk``, ``events`` (of the cause) and ``competing`` per grid time."""
        frames = {}
        for i, group in enumerate(self.groups):
            frames[(group, "at_risk")] = self.at_risk[i]
            frames[(group, "events")] = self.events[i]
            frames[(group, "competing")] = self.competing[i]
        return pd.DataFrame(frames, index=pd.Index(self.grid, name="time"))

    def to_frame(self) -> pd.DataFrame:
        """``F(t)``, its standard error (from the variance the fit asked for) and interval per
        grid time, columns by group."""
        columns = {}
        for group in self.cumulative_incidence_.columns:
            columns[(group, "F(t)")] = self.cumulative_incidence_[group]
            chosen = self.gray_variance_ if self.variance == "gray" else self.variance_
            columns[(group, "std err")] = np.sqrt(chosen[group])
            columns[(group, "lower")] = self.confidence_interval_["lower"][group]
            columns[(group, "upper")] = self.confidence_interval_["upper"][group]
        return pd.DataFrame(columns)

    def _info(self) -> list[tuple[str, str]]:
        return [
            ("Cause", str(self.cause)),
            ("Groups", ", ".join(map(str, self.groups))),
            ("Grid points", str(len(self.grid))),
            ("Sites", str(self.sites)),
            ("Patients", f"{sum(self.n_obs.values()):,}"),
            ("Censored early", f"{sum(self.truncated.values()):,}"),
        ]

    def _notes(self) -> list[str]:
        notes = [
            f"Aalen-Johansen cumulative incidence of cause {self.cause}; every other cause "
            "competes; "
            + (
                "Gray's variance (as cmprsk::cuminc)"
                if self.variance == "gray"
                else "delta-method (Greenwood-type) variance"
            )
            + f", log(-log) intervals at {1 - self.alpha:.0%}"
        ]
        if self.secure:
            notes.append(
                "secure aggregation: the coordinator saw only the counts summed over sites"
            )
        cut = ", ".join(f"{s}={n}" for s, n in self.truncated.items() if n)
        if cut:
            notes.append(
                f"patients censored at their site's safe horizon: {cut} (a count below the "
                "site's threshold k is shown as k, an upper bound)"
            )
        return notes

    def summary(self) -> Summary:
        """The curves with their intervals at every grid time: text a notebook shows as a
        table."""
        title = "Federated cumulative incidence (Aalen-Johansen)"
        return render_summary(title, self._info(), self.to_frame(), self._notes())

    def _repr_html_(self) -> str:
        title = "Federated cumulative incidence (Aalen-Johansen)"
        return render_html(title, self._info(), self.to_frame(), self._notes())

    def plot(self, ax=None):
        """Step curves with their confidence bands, by group; returns the figure."""
        return step_curves(
            self.cumulative_incidence_,
            self.confidence_interval_,
            start=0.0,
            label=f"cumulative incidence of cause {self.cause}",
            ax=ax,
        )

    def __repr__(self) -> str:
        groups = ", ".join(map(str, self.groups))
        return (
            f"<CumulativeIncidenceResults: cause {self.cause}, {len(self.grid)} grid points, "
            f"groups {groups}>"
        )
