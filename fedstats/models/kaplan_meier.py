"""Federated Kaplan–Meier curves from counts on a shared time grid.

Sites release, per group and grid point, the number at risk ``n_gk`` and of
events ``d_gk`` (:mod:`fedstats.site.handlers.survival`, with its disclosure rules);
the coordinator sums them over sites. On the grid's time scale (each time
coarsened up to the next grid point) the sums are the pooled counts, so:

* Kaplan–Meier (Kaplan & Meier, JASA 1958): ``S(g_k) = prod_{j<=k} (1 - d_j / n_j)``;
* Greenwood's variance, ``Var log S(g_k) = sum_{j<=k} d_j / (n_j (n_j - d_j))``,
  and the exponential-Greenwood ("log-log") interval
  ``exp(-exp(log(-log S) -/+ z sqrt(V) / log S))`` (Kalbfleisch & Prentice,
  2002, section 1.3; lifelines' default);
* under record-level privacy, the interval on the log-log scale adds the
  variance the noise puts on ``L = log(-log S)`` to Greenwood's
  ``V / (log S)^2``: lower and upper bounds ``exp(-exp(L +/- z sqrt(V / (log S)^2
  + V_noise)))``.
  ``V_noise`` comes from a parametric bootstrap of the noisy counts (Ferrando,
  Wang & Sheldon, "Parametric bootstrap for differentially private confidence
  intervals", AISTATS 2022): fresh noise of the released sums' variance on the
  released deaths and censorings, the same post-processing, the curve again,
  and the variance of ``L`` across draws. ``V_noise / (V / (log S)^2 + V_noise)``
  is the noise share (:attr:`KaplanMeierResults.noise_share_`);
* the log-rank test is in :mod:`fedstats.models.logrank`, on the same counts.

With a grid holding every distinct follow-up time (allowed only when the
disclosure threshold is 1) the results are those of the pooled data. Each
site ends each group's counts at its own horizon (see
:mod:`fedstats.site.handlers.survival`); the patients so censored are reported per
site (``counts.truncated``; a count below the site's threshold ``k`` is
reported as ``k``, an upper bound), and a grid too fine for the sites' events shows
as curves ending early. Past one site's horizon the sums lack that site's patients,
so a pooled value is released only where every site's counts reach
(:mod:`fedstats.models.survival_horizons`); elsewhere it is NaN, "not released", and
a :class:`~fedstats.SurvivalHorizonWarning` names the sites and their horizons.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

import accounting
from fedstats.contract.design import Level, normalise_level
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.tasks.survival import TASK, grid_problem
from fedstats.errors import StudyConfigurationError, SurvivalHorizonWarning
from fedstats.models.agree import agreed_levels
from fedstats.models.federation import Federation
from fedstats.models.plot_text import literal
from fedstats.models.privacy import RecordDP
from fedstats.models.privacy.spending import reply_ledger_head
from fedstats.models.secure_aggregation import SecureAggregation, secure_sum, summed_replies
from fedstats.models.summary import Summary, _fmt, render_html, render_summary
from fedstats.models.survival_horizons import (
    SECURE,
    cut_short,
    cut_short_warnings,
    describe_stops,
    horizon_times,
    released_points,
    site_reach,
)
from fedstats.models.utility import NOISE_DOMINATES, warn
from studyfiles.fit_records import checked_curve_record
from studyfiles.json_values import json_number, json_numbers


@dataclass(frozen=True)
class GridCounts:
    """Pooled counts on the agreed grid: ``at_risk`` and ``events`` are groups x grid points."""

    grid: np.ndarray
    groups: tuple[Level, ...]
    at_risk: np.ndarray
    events: np.ndarray
    truncated: dict[str, int]
    n_obs: dict[str, int]
    noise_multiplier: float | None = None
    """Under record-level privacy: the Gaussian noise multiplier of every site's release."""
    epsilon_spent: dict[str, float] | None = None
    """Under record-level privacy: each site's cumulative RDP epsilon for the study after it."""
    sites: int = 0
    """How many sites' counts are in the sums."""
    secure: bool = False
    """Whether the sums came by secure aggregation (then only totals are known, not sites')."""
    censored: np.ndarray | None = None
    """Under record-level privacy: the summed noisy censorings, clipped at 0 (groups x grid)."""
    noises: float = 0.0
    """Under record-level privacy: how many sites' noises each sum carries, one per site in
    the clear; under secure aggregation with threshold ``t``, ``survivors / t`` (each survivor
    adds ``1/t`` of the variance)."""
    noise_variance: float | None = None
    """Under record-level privacy: the variance of the noise in each summed count (deaths or
    censorings of one group at one grid point), ``sigma^2 noises`` (L2 sensitivity 1)."""
    fixed_seed: dict[str, bool] | None = None
    """Under record-level privacy: whether each site's noise came from a fixed seed (as the
    site reported it; fixed noise gives no privacy)."""
    ledger_heads: dict[str, tuple[int, str]] | None = None
    """Under record-level privacy: each site's ledger chain head after its charge, as
    (entry count, hash) from its reply; the study record keeps them."""
    strata: tuple[str, ...] = ()
    """The strata columns, when the counts are stratified."""
    strata_levels: tuple[tuple[Level, ...], ...] = ()
    """Each stratum's levels of the strata columns, in the order of the counts' rows: row
    ``s * len(groups) + g`` holds group ``g`` of stratum ``s``."""
    weights: str | None = None
    """The column of frequency weights the counts sum, when weighted."""
    deferred: bool = False
    """Whether the sites deferred sparse deaths (``sparse_events="defer"``)."""
    reach: dict[str, np.ndarray] | None = field(default_factory=dict)
    """Per site, per row of the counts, the last grid index its counts reach
    (:func:`fedstats.models.survival_horizons.site_reach`, computed from the released counts);
    empty when no site cuts (private counts); ``None`` when unknown (secure aggregation with
    patients censored at horizons)."""

    @property
    def released(self) -> np.ndarray:
        """``cells x grid``: where every site's counts reach the point, so a sum is pooled."""
        return released_points(self.reach, self.at_risk.shape)

    @property
    def n_strata(self) -> int:
        return max(len(self.strata_levels), 1)

    def by_stratum(self, array: np.ndarray) -> np.ndarray:
        """``array`` (``... x cells x grid``) as ``... x strata x groups x grid``."""
        shape = array.shape
        return array.reshape(*shape[:-2], self.n_strata, len(self.groups), shape[-1])

    def cell_labels(self) -> list[str]:
        """A name for each row of the counts: the group, or ``stratum / group``."""
        if not self.strata:
            return [str(g) for g in self.groups]
        return [
            f"{', '.join(f'{c}={v}' for c, v in zip(self.strata, levels, strict=True))} / {g}"
            for levels in self.strata_levels
            for g in self.groups
        ]


def time_grid(
    grid: Sequence[float] | np.ndarray | None, width: float | None, horizon: float | None
) -> np.ndarray:
    """The grid: given points, or ``width, 2 width, ...`` up to ``horizon``."""
    if grid is not None:
        if width is not None or horizon is not None:
            raise StudyConfigurationError("give either grid= or width= with horizon=, not both")
        points = np.asarray(grid, dtype=np.float64)
    else:
        if width is None or horizon is None or not (0 < width <= horizon):
            raise StudyConfigurationError(
                "a federated survival curve needs a time grid: grid=[...] or width= and "
                "horizon= (e.g. width=30, horizon=3650 for monthly steps over ten years)"
            )
        points = width * np.arange(1, int(np.ceil(horizon / width)) + 1, dtype=np.float64)
    problem = grid_problem(points)
    if problem is not None:
        raise StudyConfigurationError(problem)
    return points


def grid_counts(
    federation: Federation,
    *,
    time: str,
    event: str,
    group: str | None,
    levels: Sequence[Level] | None,
    grid: np.ndarray,
    analysis: str,
    privacy: RecordDP | None = None,
    sparse_events: str = "end",
    secure: SecureAggregation | None = None,
    strata: Sequence[str] = (),
    strata_levels: Sequence[Sequence[Level]] | None = None,
    weights: str | None = None,
) -> GridCounts:
    """Agree group (and strata) levels, then collect and sum every site's counts on the grid.

    With ``strata``, the counts come per stratum (the crossing of the strata
    columns' levels) and group; a stratum is a value of a column, so it spans
    sites and its counts add across them. With ``weights``, the counts are
    sums of a column of frequency weights (exact releases only). With
    ``secure``, the sums come by secure aggregation: the coordinator
    learns the pooled counts only; under privacy each site adds its share
    of one central noise (:mod:`fedstats.models.secure_aggregation`).
    """
    if privacy is not None and weights is not None:
        raise StudyConfigurationError(
            f"frequency weights ({weights!r}) cannot be used under differential privacy: a "
            "row would move each count by its weight, which the noise for one patient does not "
            "cover; drop weights= or privacy="
        )
    groups: tuple[Level, ...] = ()
    if group is not None:
        groups = _levels_for(federation, group, levels, analysis, privacy, "levels")
    strata = tuple(strata)
    if strata_levels is not None and len(strata_levels) != len(strata):
        raise StudyConfigurationError("strata_levels= lists the levels of each strata column")
    agreed_strata = tuple(
        _levels_for(
            federation, column, None if strata_levels is None else strata_levels[i], analysis,
            privacy, "strata_levels",
        )
        for i, column in enumerate(strata)
    )  # fmt: skip
    if sparse_events not in ("end", "defer"):
        raise StudyConfigurationError(
            f"sparse_events must be 'end' or 'defer', got {sparse_events!r}"
        )
    args: dict[str, Any] = {
        "time": time, "event": event, "group": group, "levels": list(groups), "grid": grid,
    }  # fmt: skip
    if strata:
        args["strata"] = list(strata)
        args["strata_levels"] = [list(levels) for levels in agreed_strata]
    if weights is not None:
        args["weights"] = weights
    if sparse_events != "end":
        args["sparse_events"] = sparse_events
    layout = {
        "groups": groups if group is not None else ("all",),
        "strata": strata,
        "strata_levels": tuple(itertools.product(*agreed_strata)) if strata else (),
        "weights": weights,
        "deferred": sparse_events == "defer" and privacy is None,
    }
    if privacy is not None:
        return _private_counts(federation, args, privacy, analysis, secure, layout)
    sites = len(federation.sites)
    if secure is not None:
        total = summed_replies(federation, TASK, args, analysis=analysis, secure=secure)
        rounded = np.rint if weights is None else np.asarray
        cut = round(total["truncated"])
        return GridCounts(
            grid=grid,
            at_risk=rounded(total["at_risk"]),
            events=rounded(total["events"]),
            truncated={SECURE: cut},
            n_obs={SECURE: round(total["n_obs"])},
            sites=sites,
            secure=True,
            reach=None if cut else {SECURE: site_reach(total["at_risk"], 0)},
            **layout,
        )
    replies = federation.request(TASK, args, analysis=analysis)
    return GridCounts(
        grid=grid,
        at_risk=sum(r["at_risk"] for r in replies.values()),
        events=sum(r["events"] for r in replies.values()),
        truncated={s: int(r["truncated"]) for s, r in replies.items()},
        n_obs={s: int(r["n_obs"]) for s, r in replies.items()},
        sites=sites,
        reach={s: site_reach(r["at_risk"], int(r["truncated"])) for s, r in replies.items()},
        **layout,
    )


def _levels_for(
    federation: Federation,
    column: str,
    levels: Sequence[Level] | None,
    analysis: str,
    privacy: RecordDP | None,
    argument: str,
) -> tuple[Level, ...]:
    """A grouping or strata column's levels: given, or agreed with the sites (not under
    privacy, where sites release no levels)."""
    if privacy is not None and levels is None:
        raise StudyConfigurationError(
            f"under differential privacy the levels of {column!r} must be given ({argument}=, "
            "from the study specification): sites do not release levels"
        )
    return _group_levels(federation, column, levels, analysis)


def _private_counts(
    federation: Federation,
    args: dict,
    privacy: RecordDP,
    analysis: str,
    secure: SecureAggregation | None,
    layout: dict[str, Any],
) -> GridCounts:
    """Noisy deaths and censorings from every site, summed, then made consistent.

    One Gaussian release per site with noise multiplier ``sigma`` (given, or
    calibrated so that the release alone costs ``(epsilon, delta)``), charged
    to the site's ledger before it reads a row. Post-processing, free of
    privacy cost: the sums over sites are clipped at 0, the numbers at risk
    are the reverse cumulative sums of deaths plus censorings, and deaths
    never exceed them.
    """
    sigma = privacy.noise_multiplier
    if sigma is None:
        sigma = accounting.calibrate_gaussian(privacy.epsilon, privacy.delta)
    dp = DpRequest(
        noise_multipliers={"events": float(sigma)},
        study=federation.study,
        analysis=analysis,
        note="survival counts on a time grid",
    )
    private = {**args, "dp": dp.to_args()}
    if secure is not None:
        summed = secure_sum(federation, TASK, private, analysis=analysis, options=secure)
        replies = summed.public
        events, censored = summed.total["events"], summed.total["censored"]
        noises = len(summed.survivors) / summed.threshold
    else:
        replies = federation.request(TASK, private, analysis=analysis)
        events = sum(r["events"] for r in replies.values())
        censored = sum(r["censored"] for r in replies.values())
        noises = float(len(replies))
    at_risk, events, censored = _consistent_counts(events, censored)
    return GridCounts(
        grid=args["grid"],
        at_risk=at_risk,
        events=events,
        truncated={},
        n_obs={},
        noise_multiplier=float(sigma),
        epsilon_spent={s: float(r["dp_epsilon_spent"]) for s, r in replies.items()},
        fixed_seed={s: bool(r["dp_fixed_seed"]) for s, r in replies.items()},
        ledger_heads={
            s: head for s, r in replies.items() if (head := reply_ledger_head(r)) is not None
        },
        sites=len(replies),
        secure=secure is not None,
        censored=censored,
        noises=noises,
        noise_variance=float(sigma) ** 2 * noises,
        **layout,
    )


def _consistent_counts(
    events: np.ndarray, censored: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noisy summed deaths and censorings made counts: ``(at_risk, deaths, censorings)``.

    Post-processing along the last axis (the grid), so a stack of draws goes
    through at once: both clipped at 0, ``n_k = sum_{j>=k} (d_j + c_j)``, and
    ``d_k <= n_k``.
    """
    events = np.maximum(events, 0.0)
    censored = np.maximum(censored, 0.0)
    at_risk = np.cumsum((events + censored)[..., ::-1], axis=-1)[..., ::-1]
    return at_risk, np.minimum(events, at_risk), censored


def _group_levels(
    federation: Federation, group: str, levels: Sequence[Level] | None, analysis: str
) -> tuple[Level, ...]:
    if levels is not None:
        fixed = tuple(normalise_level(v) for v in levels)
        if not fixed:
            raise StudyConfigurationError(f"no levels given for {group!r}")
        return fixed
    return agreed_levels(federation, group, analysis)


class KaplanMeier:
    """Federated Kaplan–Meier estimator with Greenwood intervals, overall or by group.

    Parameters
    ----------
    time, event:
        Follow-up time (>= 0) and event indicator (0/1) columns.
    group:
        Optional grouping column; its levels are agreed across sites (or
        given in ``levels``).
    grid, width, horizon:
        The shared time grid: explicit points, or steps of ``width`` up to
        ``horizon`` (both in the unit of ``time``).
    sparse_events:
        What a site does at an interval holding 1 to ``k - 1`` deaths of a
        group: ``"end"`` (default) ends that group's curve before it;
        ``"defer"`` moves those deaths to the next grid point by which ``k``
        have accumulated (:func:`fedstats.site.handlers.survival.deferred_points`),
        which overstates survival a little between the two points but keeps
        the curve going. As each site may then hold up to ``k - 1`` deaths not
        yet released, ``S = 1`` before the first released death is not
        released (:func:`unknown_survival_one`).
    privacy:
        :class:`fedstats.RecordDP`: each site releases Gaussian-noised deaths
        and censorings per interval instead (one release, ``epsilon`` and
        ``delta`` or ``noise_multiplier``; its ``rounds``, ``bounds`` and
        ``row_norm`` do not apply), charged to its ledger. The intervals then
        add the noise's variance (see the module docstring), and a curve the
        noise dominates raises :class:`~fedstats.PrivacyUtilityWarning`.
    weights:
        A column of frequency weights (finite, >= 0): each row stands for
        ``w`` patients, so the numbers at risk and of events are sums of
        weights and the curve and Greenwood's variance are those of the rows
        repeated ``w`` times (lifelines' ``KaplanMeierFitter.fit(weights=)``).
        Sites check the column (:mod:`fedstats.site.handlers.survival_cells`):
        every released sum stands for at least ``k`` rows of positive weight,
        none dominating it. Exact fits only.
    strata:
        The same as ``group`` (one curve per level), under the name R's
        ``survfit(Surv(time, event) ~ arm)`` gives the curves.
    """

    def __init__(
        self,
        time: str,
        event: str,
        *,
        group: str | None = None,
        levels: Sequence[Level] | None = None,
        grid: Sequence[float] | np.ndarray | None = None,
        width: float | None = None,
        horizon: float | None = None,
        alpha: float = 0.05,
        privacy: RecordDP | None = None,
        sparse_events: str = "end",
        weights: str | None = None,
        strata: str | None = None,
    ) -> None:
        if strata is not None:  # R's survfit(Surv(time, event) ~ arm) calls the groups strata
            if group is not None and group != strata:
                raise StudyConfigurationError(
                    f"group= and strata= name the same thing (one curve per level); got "
                    f"group={group!r} and strata={strata!r}"
                )
            group = strata
        _check_privacy(privacy)
        if weights is not None and not (isinstance(weights, str) and weights):
            raise StudyConfigurationError("weights= names a column of frequency weights")
        if not 0 < alpha < 1:
            raise StudyConfigurationError(f"alpha must be in (0, 1), got {alpha}")
        self.time, self.event, self.group = time, event, group
        self.levels = list(levels) if levels is not None else None
        self.grid = time_grid(grid, width, horizon)
        self.alpha = alpha
        self.privacy = privacy
        self.sparse_events = sparse_events
        self.weights = weights

    def fit(
        self,
        federation: Federation,
        secure_aggregation: SecureAggregation | None = None,
        *,
        privacy: RecordDP | None = None,
    ) -> KaplanMeierResults:
        """Pool the sites' counts on the grid (by secure aggregation when it is given).

        ``privacy`` may be given here, as every other model takes it (``fit(fed,
        privacy=fedstats.RecordDP(...))``), or to the constructor; not both.
        Under privacy, the bootstrap of the noise is seeded by the federation's
        ``noise_seed`` (OS entropy unless one was fixed), and each of the
        result's :attr:`~KaplanMeierResults.utility_warnings` is raised as a
        :class:`~fedstats.PrivacyUtilityWarning`. The result names its analysis
        (``analysis``, the label of its messages in the inventory).
        """
        _check_privacy(privacy)
        if privacy is not None and self.privacy is not None and privacy is not self.privacy:
            raise StudyConfigurationError(
                "privacy is given to KaplanMeier(...) and to fit(...): give it once"
            )
        privacy = privacy if privacy is not None else self.privacy
        analysis = federation.new_analysis("kaplan_meier")
        counts = grid_counts(
            federation,
            time=self.time,
            event=self.event,
            group=self.group,
            levels=self.levels,
            grid=self.grid,
            analysis=analysis,
            privacy=privacy,
            sparse_events=self.sparse_events,
            secure=secure_aggregation,
            weights=self.weights,
        )
        result = KaplanMeierResults(counts, self.alpha, seed=federation.noise_seed)
        result.analysis = analysis
        warn(result.utility_warnings, stacklevel=3)  # the caller of fit
        for message in result.horizon_warnings:
            warnings.warn(message, SurvivalHorizonWarning, stacklevel=2)
        return result


def _check_privacy(privacy: object) -> None:
    if privacy is not None and not isinstance(privacy, RecordDP):
        raise StudyConfigurationError(
            "a Kaplan–Meier curve's privacy is record-level: fedstats.RecordDP(epsilon=...)"
        )


GREENWOOD_LOGLOG = "exponential Greenwood (log-log), Kalbfleisch & Prentice 2002"
"""The interval method of an exact fit."""
PRIVATE_GREENWOOD = (
    GREENWOOD_LOGLOG + ", with the privacy noise's variance from a parametric bootstrap of the "
    "noisy counts (Ferrando, Wang & Sheldon, AISTATS 2022)"
)
"""The interval method of a private fit."""
BOOTSTRAP_DRAWS = 400
"""Draws of the parametric bootstrap of the noise."""
LOST_DRAWS = 0.05
"""Share of draws whose curve has no finite ``log(-log S)`` at a point (no death yet, every
patient dead, or nobody at risk) above which the noise's variance there is taken as infinite."""


class KaplanMeierResults:
    """Survival curves on the grid, by group, with exponential-Greenwood intervals.

    Under record-level privacy the intervals add the noise's variance on the
    log-log scale, from a parametric bootstrap of ``draws`` draws (see the
    module docstring) seeded by ``seed`` (``None``: OS entropy).
    """

    def __init__(
        self,
        counts: GridCounts,
        alpha: float,
        *,
        seed: int | None = None,
        draws: int = BOOTSTRAP_DRAWS,
    ) -> None:
        self.counts = counts
        self.alpha = alpha
        self.analysis: str | None = None
        """The label of the fit's messages in the message inventory (``None`` for curves made
        from counts directly); a study records it with the curves."""
        index = pd.Index(counts.grid, name="time")
        columns = list(counts.groups)
        survival, variance = _kaplan_meier(counts.at_risk, counts.events)
        self.survival_reaching_sites_ = pd.DataFrame(survival.T, index=index, columns=columns)
        """NOT the pooled curve: at each grid time, the product of the conditional survivals
        among the sites whose counts reach that time (a site cut at its horizon drops out of
        every later factor). Offered for inspection only, labelled as such: where it differs
        from :attr:`survival_function_` (NaN there), the sites left out may differ from the
        others, and its values are biased (upwards when the sites about to have a few deaths
        drop out)."""
        reached = counts.released
        self.reached_ = pd.DataFrame(reached.T, index=index, columns=columns)
        """Per grid time and group, whether every site's counts reach that time
        (:mod:`fedstats.models.survival_horizons`): up to a time, then not."""
        undetermined = unknown_survival_one(counts, survival)
        released = reached & ~undetermined
        self.released_ = pd.DataFrame(released.T, index=index, columns=columns)
        """Per grid time and group, whether the value is released as a pooled estimate: every
        site's counts reach that time, and, with deferred or noisy deaths, at least one death has
        been released by then (:func:`unknown_survival_one`). Elsewhere :attr:`survival_function_`,
        its interval and Greenwood's variance are NaN, "not released"."""
        self.horizons_: dict[str, dict[str, float | None]] | None = (
            None if counts.reach is None else horizon_times(counts.reach, counts.grid, columns)
        )
        """Per site and group, the last grid time its counts reach (``None``: they stop before
        the first); the grid's last time for a site that censored no patient at a horizon.
        Computed from the released counts (a function of them, so it releases nothing new).
        Empty for private counts (no horizon); ``None`` under secure aggregation with patients
        censored at horizons (the sums hide where each site stops)."""
        self.horizon_warnings: list[str] = cut_short_warnings(
            counts.reach, counts.grid, [str(c) for c in columns],
            truncated=sum(counts.truncated.values()),
        )  # fmt: skip
        unknown_ones = unknown_one_warnings(counts, undetermined & reached, columns)
        if counts.noise_variance is None:
            self.horizon_warnings += unknown_ones
        """Each group whose pooled curve is not released to the grid's end, with the sites and
        horizons that stop it, and each group whose deferred curve is not released before its
        first released death (:class:`~fedstats.SurvivalHorizonWarning`)."""
        survival = np.where(released, survival, np.nan)
        variance = np.where(released, variance, np.nan)
        self.survival_function_ = pd.DataFrame(survival.T, index=index, columns=columns)
        self.greenwood_ = pd.DataFrame(variance.T, index=index, columns=columns)
        z = stats.norm.ppf(1 - alpha / 2)
        self.noise_share_: pd.DataFrame | None = None
        """Under privacy, per grid point and group, the noise's share of the variance of
        ``log(-log S)``, ``V_noise / (V / (log S)^2 + V_noise)`` (NaN where ``S`` is 1, 0 or
        undefined); ``None`` for an exact fit."""
        self.utility_warnings: list[str] = []
        """What makes this private result misleading, in plain words
        (:class:`~fedstats.PrivacyUtilityWarning`); empty when nothing does."""
        private = counts.noise_variance is not None
        self.interval_method = PRIVATE_GREENWOOD if private else GREENWOOD_LOGLOG
        """How :attr:`confidence_interval_` was obtained, in words."""
        if not private:
            with np.errstate(divide="ignore", invalid="ignore"):
                spread = z * np.sqrt(variance) / np.log(survival)
        else:
            noise = _noise_loglog_variance(counts, draws, np.random.default_rng(seed))
            sampling = _greenwood_loglog(survival, variance)
            spread = -z * np.sqrt(sampling + np.where(np.isnan(noise), 0.0, noise))
            share = _noise_share(sampling, noise)
            self.noise_share_ = pd.DataFrame(share.T, index=index, columns=columns)
            self.utility_warnings = [
                *_dominated_curves_warnings(self.noise_share_),
                *empty_groups_warnings(counts),
                *unknown_ones,
            ]
        lower, upper = _loglog_bounds(survival, spread)
        self.confidence_interval_ = {
            "lower": pd.DataFrame(lower.T, index=index, columns=columns),
            "upper": pd.DataFrame(upper.T, index=index, columns=columns),
        }

    @property
    def noise_dominated(self) -> bool:
        """Whether any warning says the privacy noise makes this result misleading."""
        return bool(self.utility_warnings)

    @property
    def event_table(self) -> pd.DataFrame:
        """Pooled ``at_risk`` and ``events`` per grid point (columns by group)."""
        frames = {}
        for i, group in enumerate(self.counts.groups):
            frames[(group, "at_risk")] = self.counts.at_risk[i]
            frames[(group, "events")] = self.counts.events[i]
        return pd.DataFrame(frames, index=pd.Index(self.counts.grid, name="time"))

    @property
    def median_survival_time_(self) -> pd.Series:
        """First grid time with ``S <= 0.5`` per group: ``inf`` if the curve, released to the
        grid's end, never reaches it; NaN if it does not before it is no longer released."""
        out = {}
        for group in self.survival_function_.columns:
            curve = self.survival_function_[group]
            below = curve.index[curve <= 0.5]
            whole = bool(self.reached_[group].all())
            out[group] = float(below[0]) if len(below) else (np.inf if whole else np.nan)
        return pd.Series(out, name="median")

    @property
    def grid(self) -> np.ndarray:
        return self.counts.grid

    def to_record(self) -> dict[str, Any]:
        """The curves as plain JSON values, for a study's record of what was released.

        Keys: ``model`` (``"KaplanMeier"``), ``alpha``, ``grid``, ``groups``; per
        group, one value per grid time: ``survival``, ``lower``, ``upper``,
        ``greenwood`` (``Var log S``) -- ``None`` where nobody is left at risk --
        and the pooled ``at_risk`` and ``events`` (noisy under privacy);
        ``median`` per group (the first grid time with ``S <= 0.5``, ``None`` if
        never reached or not released); ``n_obs`` and ``truncated`` per site (empty under
        privacy); ``horizons`` per site and group (the last grid time its counts reach,
        ``None`` before the first; ``None`` as a whole when secure aggregation hides them),
        ``not_released_from`` per group (the first grid time some site's counts do not reach,
        ``None`` if they all reach the end), ``released`` per group and time (whether the
        value is released as a pooled estimate) and ``horizon_warnings``; ``interval_method``,
        ``noise_share`` (per group and time, ``None`` for an exact fit) and
        ``utility_warnings``. Privacy facts,
        ``None`` for an exact fit: ``noise_multiplier``, ``noise_sd_per_count``
        (the standard deviation of the noise in each summed count) and
        ``epsilon_spent`` (each site's cumulative epsilon for the study after
        this release), ``fixed_seed`` (per site, whether its noise came
        from a fixed seed) and ``ledger_heads`` (per site, its ledger's entry
        count and chain head after this release); ``secure_aggregation`` says
        whether the counts were summed by secure aggregation. The format is
        :class:`studyfiles.fit_records.CurveRecord`, checked before it is returned.
        """
        counts = self.counts
        groups = [str(group) for group in counts.groups]

        def by_group(frame: pd.DataFrame) -> dict[str, list[Any]]:
            return {str(group): json_numbers(frame[group]) for group in frame.columns}

        def rows(array: np.ndarray) -> dict[str, list[Any]]:
            return {g: json_numbers(row) for g, row in zip(groups, array, strict=True)}

        variance = counts.noise_variance
        record = {
            "model": "KaplanMeier",
            "alpha": json_number(float(self.alpha)),
            "grid": json_numbers(counts.grid),
            "groups": groups,
            "survival": by_group(self.survival_function_),
            "lower": by_group(self.confidence_interval_["lower"]),
            "upper": by_group(self.confidence_interval_["upper"]),
            "greenwood": by_group(self.greenwood_),
            "at_risk": rows(counts.at_risk),
            "events": rows(counts.events),
            "median": {str(g): json_number(m) for g, m in self.median_survival_time_.items()},
            "n_obs": {site: int(n) for site, n in counts.n_obs.items()},
            "truncated": {site: int(n) for site, n in counts.truncated.items()},
            "horizons": None
            if self.horizons_ is None
            else {
                site: {str(g): json_number(h) for g, h in by_site.items()}
                for site, by_site in self.horizons_.items()
            },
            "not_released_from": {
                str(g): None if reached.all() else json_number(float(reached.idxmin()))
                for g, reached in self.reached_.items()
            },
            "released": {str(g): [bool(r) for r in rows] for g, rows in self.released_.items()},
            "horizon_warnings": list(self.horizon_warnings),
            "interval_method": self.interval_method,
            "noise_share": None if self.noise_share_ is None else by_group(self.noise_share_),
            "utility_warnings": list(self.utility_warnings),
            "noise_multiplier": json_number(counts.noise_multiplier),
            "noise_sd_per_count": None if variance is None else json_number(np.sqrt(variance)),
            "epsilon_spent": None
            if counts.epsilon_spent is None
            else {site: json_number(e) for site, e in counts.epsilon_spent.items()},
            "fixed_seed": None if counts.fixed_seed is None else dict(counts.fixed_seed),
            "ledger_heads": None
            if counts.ledger_heads is None
            else {s: {"entries": n, "head": h} for s, (n, h) in counts.ledger_heads.items()},
            "secure_aggregation": bool(counts.secure),
        }
        return checked_curve_record(record)

    def _info(self) -> list[tuple[str, str]]:
        counts = self.counts
        info = [
            ("Groups", ", ".join(map(str, counts.groups))),
            ("Grid points", str(len(counts.grid))),
            ("Sites", str(counts.sites)),
        ]
        if counts.noise_multiplier is not None:
            info.append(("Noise multiplier", f"{counts.noise_multiplier:.4g}"))
            info.append(("Noise sd per count", f"{np.sqrt(counts.noise_variance or 0.0):.4g}"))
        else:
            info.append(("Patients", f"{sum(counts.n_obs.values()):,}"))
            info.append(("Censored early", f"{sum(counts.truncated.values()):,}"))
        return info

    def _notes(self) -> list[str]:
        counts = self.counts
        warned = [f"WARNING: {w}" for w in (*self.horizon_warnings, *self.utility_warnings)]
        method = f"intervals: {self.interval_method}"
        secure = (
            [
                "secure aggregation: the coordinator saw only the counts summed over sites"
                + ("; each site added 1/sqrt(t) of the noise" if counts.noise_multiplier else "")
            ]
            if counts.secure
            else []
        )
        if counts.noise_multiplier is not None:
            spent = ", ".join(f"{s}={e:.3g}" for s, e in (counts.epsilon_spent or {}).items())
            return [
                *warned,
                "record-level DP: each site released Gaussian-noised deaths and censorings; "
                f"epsilon spent for the study so far: {spent}",
                method,
                *secure,
            ]
        cut = ", ".join(f"{s}={n}" for s, n in counts.truncated.items() if n)
        weighted = (
            [f"frequency weights {counts.weights!r}: at risk and events are sums of weights"]
            if counts.weights is not None
            else []
        )
        return [
            *warned,
            *weighted,
            *secure,
            *(
                [
                    f"patients censored at their site's safe horizon: {cut} (a count below the "
                    "site's threshold k is shown as k, an upper bound)"
                ]
                if cut
                else []
            ),
            method,
        ]

    def _table(self) -> pd.DataFrame:
        """Per group: S(t), lower, upper (and the noise share); "not released" where the value
        is not a pooled estimate (:attr:`released_`)."""
        columns = {}
        for group in self.survival_function_.columns:
            released = self.released_[group]
            columns[(group, "S(t)")] = self.survival_function_[group]
            columns[(group, "lower")] = self.confidence_interval_["lower"][group]
            columns[(group, "upper")] = self.confidence_interval_["upper"][group]
            if self.noise_share_ is not None:
                columns[(group, "noise share")] = self.noise_share_[group]
            if not released.all():
                for name in ("S(t)", "lower", "upper"):
                    columns[(group, name)] = (
                        columns[(group, name)].map(_fmt).where(released, "not released")
                    )
        return pd.DataFrame(columns)

    def summary(self) -> Summary:
        """Survival with its intervals at every grid point: text a notebook shows as a table."""
        return render_summary("Federated Kaplan-Meier", self._info(), self._table(), self._notes())

    def _repr_html_(self) -> str:
        return render_html("Federated Kaplan-Meier", self._info(), self._table(), self._notes())

    def plot(self, ax=None):
        """Step curves with their confidence bands, by group, drawn only where released; a
        curve not released to the grid's end is marked there and the figure's caption names
        the sites and horizons that stop it. Returns the figure."""
        figure = step_curves(
            self.survival_function_, self.confidence_interval_, start=1.0, label="survival", ax=ax
        )
        captions = self._cut_short_captions()
        if captions:
            axes = figure.axes[0] if ax is None else ax
            first = min(first for first, _ in self._cut_short().values())
            start = max([0.0, *(t for t in self.grid if t < first)])
            axes.axvspan(start, float(self.grid[-1]), color="grey", alpha=0.1, linewidth=0)
            axes.set_title(literal("\n".join(captions)), fontsize="small", loc="left")
        return figure

    def _cut_short(self) -> dict[str, tuple[float, list[tuple[str, float | None]]]]:
        reach = self.counts.reach
        if reach is None:
            return {str(g): (float(self.grid[0]), []) for g in self.counts.groups}
        return cut_short(reach, self.grid, [str(g) for g in self.counts.groups])

    def _cut_short_captions(self) -> list[str]:
        """Per group not released to the grid's end: from where, and whose counts stop."""
        captions = []
        for group, (first, stops) in self._cut_short().items():
            whose = (
                f": counts of {describe_stops(stops, self.grid)} stop earlier"
                if stops
                else ": secure aggregation hides where the sites' counts stop"
            )
            captions.append(f"group {group} not released from {first:g}{whose}")
        return captions

    def __repr__(self) -> str:
        groups = ", ".join(map(str, self.counts.groups))
        return f"<KaplanMeierResults: {len(self.grid)} grid points, groups {groups}>"


def unknown_survival_one(counts: GridCounts, survival: np.ndarray) -> np.ndarray:
    """``cells x grid``: where the curve's ``S = 1`` is not known (always ``False`` for
    exact counts without deferral).

    Where no death has been released yet the curve reads ``S = 1`` with the
    zero-width interval ``[1, 1]``, a claim that nobody died. Two releases
    cannot back it: with ``sparse_events="defer"`` a site holds back the deaths
    of an interval with fewer than ``k`` of them until ``k`` have accumulated,
    so each site may hold up to ``k - 1`` deaths not yet released; under
    record-level privacy the noisy deaths, clipped at 0, can hide a few. Those
    points are not released. From the first released death on the curve is
    released (a deferred curve as the Kaplan–Meier estimate of the deferred
    times, which can overstate survival by the deaths still held back, see
    :class:`KaplanMeier`). Post-processing of the released counts: nothing here
    depends on what a site held back."""
    if not counts.deferred and counts.noise_variance is None:
        return np.zeros(survival.shape, dtype=bool)
    return survival == 1.0


def unknown_one_warnings(
    counts: GridCounts, unknown: np.ndarray, groups: Sequence[Any]
) -> list[str]:
    """One warning per group whose curve is not released before its first released death."""
    why = (
        "the privacy noise (clipped at 0) can hide a few deaths"
        if counts.noise_variance is not None
        else "under sparse_events='defer' each site may hold up to k - 1 deaths not yet released"
    )
    return [
        f"the survival curve of group {group} is not released up to time "
        f"{counts.grid[np.flatnonzero(rows)[-1]]:g}: no death was released by then, but {why}, "
        "so S = 1 there is not known"
        for group, rows in zip(groups, unknown, strict=True)
        if rows.any()
    ]


def _kaplan_meier(at_risk: np.ndarray, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Survival and Greenwood's ``Var log S`` per group and grid point (NaN once nobody is left).

    Along the last axis (the grid): groups x grid, or draws x groups x grid.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(at_risk > 0, 1.0 - events / at_risk, 1.0)
        increment = np.where(
            (at_risk > 0) & (at_risk > events), events / (at_risk * (at_risk - events)), 0.0
        )
    survival = np.cumprod(factor, axis=-1)
    variance = np.cumsum(increment, axis=-1)
    gone = np.cumsum(at_risk[..., ::-1] > 0, axis=-1)[..., ::-1] == 0  # no one at risk from here
    survival[gone] = np.nan
    variance[gone] = np.nan
    return survival, variance


def _loglog_bounds(survival: np.ndarray, spread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``exp(-exp(log(-log S) - spread))`` and ``exp(-exp(log(-log S) + spread))``, with
    ``spread = z se / log S <= 0`` (``-z se`` for any ``se`` of ``log(-log S)``): both 1
    where ``S`` is 1, NaN where ``S`` is NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        loglog = np.log(-np.log(survival))
        lower = np.exp(-np.exp(loglog - spread))
        upper = np.exp(-np.exp(loglog + spread))
    lower = np.where(survival == 1.0, 1.0, lower)
    upper = np.where(survival == 1.0, 1.0, upper)
    lower = np.where(np.isnan(survival), np.nan, lower)
    upper = np.where(np.isnan(survival), np.nan, upper)
    return lower, upper


def _greenwood_loglog(survival: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """Greenwood's variance of ``log(-log S)`` by the delta method: ``V / (log S)^2``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return variance / np.log(survival) ** 2


def _noise_loglog_variance(counts: GridCounts, draws: int, rng: np.random.Generator) -> np.ndarray:
    """The variance the privacy noise puts on ``log(-log S)``, by parametric bootstrap.

    Ferrando, Wang & Sheldon (AISTATS 2022): the released deaths and
    censorings (clipped at 0) stand for the true ones; each draw adds fresh
    ``N(0, noise_variance)`` to every cell, post-processes as the coordinator
    did (:func:`_consistent_counts`) and computes the curve. The variance of
    ``log(-log S*)`` over the draws with a finite value; infinite where more
    than :data:`LOST_DRAWS` of them have none (the noise can erase the deaths
    or the patients), NaN where the released ``S`` is 1, 0 or undefined.
    """
    at_risk, events = noisy_count_draws(counts, draws, rng)
    curves, _ = _kaplan_meier(at_risk, events)
    with np.errstate(divide="ignore", invalid="ignore"):
        loglog = np.log(-np.log(curves))
        finite = np.isfinite(loglog)
        kept = finite.sum(axis=0)
        values = np.where(finite, loglog, 0.0)
        mean = values.sum(axis=0) / kept
        squares = np.where(finite, (loglog - mean) ** 2, 0.0).sum(axis=0)
        variance = squares / (kept - 1)
    variance = np.where(kept < (1 - LOST_DRAWS) * draws, np.inf, variance)
    survival, _ = _kaplan_meier(counts.at_risk, counts.events)
    return np.where((survival > 0) & (survival < 1), variance, np.nan)


def noisy_count_draws(
    counts: GridCounts, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``draws`` replays of the released noisy counts: ``(at_risk, events)``, each
    ``draws x groups x grid points``.

    The released deaths and censorings (clipped at 0) stand for the true ones;
    each draw adds fresh ``N(0, noise_variance)`` to every cell and
    post-processes as the coordinator did (:func:`_consistent_counts`): the
    parametric bootstrap of Ferrando, Wang & Sheldon (AISTATS 2022).
    """
    released = _released_censorings(counts)
    shape = (draws, *counts.events.shape)
    sd = float(np.sqrt(counts.noise_variance or 0.0))
    at_risk, events, _ = _consistent_counts(
        counts.events + rng.normal(0.0, sd, shape), released + rng.normal(0.0, sd, shape)
    )
    return at_risk, events


def _released_censorings(counts: GridCounts) -> np.ndarray:
    """The summed censorings behind ``counts``: as released, else ``n_k - n_{k+1} - d_k``."""
    if counts.censored is not None:
        return counts.censored
    after = np.concatenate([counts.at_risk[:, 1:], np.zeros((len(counts.at_risk), 1))], axis=1)
    return np.maximum(counts.at_risk - after - counts.events, 0.0)


def _noise_share(sampling: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``V_noise / (V_sampling + V_noise)``: 1 where the noise's variance is infinite, NaN
    where either is undefined."""
    with np.errstate(divide="ignore", invalid="ignore"):
        share = noise / (sampling + noise)
    return np.where(np.isinf(noise) & ~np.isnan(sampling), 1.0, share)


def _dominated_curves_warnings(shares: pd.DataFrame) -> list[str]:
    """One warning naming each group whose noise share exceeds :data:`NOISE_DOMINATES` at a
    reported time, with the first such time."""
    dominated = []
    for group in shares.columns:
        over = shares.index[shares[group].to_numpy() > NOISE_DOMINATES]
        if len(over):
            first = over[0]
            dominated.append(
                f"group {group} from time {first:g} ({shares.loc[first, group]:.0%} there)"
            )
    if not dominated:
        return []
    return [
        "privacy noise dominates the variance of the survival curve of "
        + "; ".join(dominated)
        + f" (noise share of log(-log S) above {NOISE_DOMINATES:.0%}): from there on the "
        "curve can be far from the non-private one; read its intervals, not its values, or "
        "use a coarser grid or more budget"
    ]


def empty_groups_warnings(counts: GridCounts) -> list[str]:
    """A warning naming each group whose summed noisy number at risk at the first grid point
    is at most 0 (every noisy death and censoring of the group clipped to 0)."""
    labels = counts.cell_labels()
    empty = [g for g, n in zip(labels, counts.at_risk[:, 0], strict=True) if n <= 0]
    if not empty:
        return []
    return [
        f"the noisy number at risk at the first grid point is 0 for group {', '.join(empty)}: "
        "the noise swamps its counts, so it has no curve; use a coarser grid or more budget"
    ]


def step_curves(
    curves: pd.DataFrame,
    bands: pd.DataFrame,
    *,
    start: float,
    label: str,
    ax=None,
):  # type: ignore[no-untyped-def]
    """Step curves on a grid, one per column of ``curves``, from ``start`` at time 0, with
    their confidence bands (``bands["lower"]``, ``bands["upper"]``); returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for group in curves.columns:
        curve = curves[group].dropna()
        low = bands["lower"][group].loc[curve.index]
        high = bands["upper"][group].loc[curve.index]
        times = np.r_[0.0, curve.index.to_numpy(dtype=float)]
        ax.step(times, np.r_[start, curve], where="post", label=literal(group))
        ax.fill_between(times, np.r_[start, low], np.r_[start, high], step="post", alpha=0.2)
    ax.set_xlabel("time")
    ax.set_ylabel(literal(label))
    ax.set_ylim(0, 1.02)
    if len(curves.columns) > 1:
        ax.legend()
    return ax.figure
