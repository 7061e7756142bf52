"""Frequency-weighted federated Kaplan–Meier equals lifelines; its k protections count rows.

Oracles: lifelines ``KaplanMeierFitter().fit(T, E, weights=w)`` (survival, Greenwood's
``Var log S`` -- lifelines' ``_cumulative_sq_`` -- and the exponential-Greenwood bounds),
and the unweighted fit on the rows repeated ``w`` times, by lifelines and by fedstats
itself. Parity runs over two or three sites with ``min_count=1`` (so ``k_cell = 2``), the cell
rules on, on a grid holding every distinct time of data whose follow-up times are recoded
globally to a coarse grid (:func:`on_grid`): with ``k_cell = 2`` no row may carry more
than half of a released weighted count, so a grid of every raw time, where most deaths
are one row, ends a site's curve by its first one-row death (checked by
:func:`test_a_grid_of_every_raw_time_ends_the_weighted_curve_at_the_first_single_death`).
The protection tests use the default policy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from lifelines import KaplanMeierFitter
from lifelines.datasets import load_lung, load_waltons

import fedstats
from fedstats.contract import codec
from fedstats.contract.tasks.survival import TASK

OPEN = fedstats.DisclosurePolicy(min_count=1)
TOLERANCE = 1e-8
LUNG_GRID = np.array([122.0, 202.0, 344.0, 601.0])
"""Days: the 22.5%, 45%, 67.5% and 90% quantiles of the lung data's death times, rounded
up (finer grids end the women's curve early at a site)."""
WALTONS_GRID = np.array([15.0, 30.0, 45.0, 60.0, 75.0])
"""Days, every 15 up to the last death (75)."""


def on_grid(frame: pd.DataFrame, grid: np.ndarray, time: str, event: str) -> pd.DataFrame:
    """``frame`` with each follow-up time recoded to the next point of ``grid`` and follow-up
    beyond the last point censored there: the coarsening a site applies to its rows, done
    once on the pooled data, so the grid holds every distinct time of the recoded data and
    the oracle sees the same times as the sites."""
    point = np.searchsorted(grid, frame[time], side="left")
    beyond = point >= len(grid)
    return frame.assign(
        **{time: grid[np.minimum(point, len(grid) - 1)], event: np.where(beyond, 0, frame[event])}
    )


def split(frame: pd.DataFrame, sites: int) -> dict[str, pd.DataFrame]:
    site = np.arange(len(frame)) % sites
    return {
        f"s{k}": part.drop(columns="_site").reset_index(drop=True)
        for k, part in frame.assign(_site=site).groupby("_site")
    }


@pytest.fixture(scope="module")
def lung() -> pd.DataFrame:
    frame = load_lung()[["time", "status", "sex"]]
    rng = np.random.default_rng(41)
    frame = frame.assign(w=rng.integers(0, 6, len(frame)))  # zero weights included
    return on_grid(frame, LUNG_GRID, "time", "status")


def lifelines_fit(time, event, grid, weights=None):
    fitter = KaplanMeierFitter().fit(time, event, weights=weights)
    survival = fitter.survival_function_at_times(grid).to_numpy()
    bounds = fitter.confidence_interval_.reindex(grid, method="ffill").to_numpy()
    variance = fitter._cumulative_sq_.reindex(grid, method="ffill").to_numpy()
    return survival, bounds, variance


def test_weighted_curve_variance_and_bounds_equal_lifelines_weights(lung):
    """lifelines: ``KaplanMeierFitter().fit(time, status, weights=w)``, three sites."""
    fed = fedstats.Federation.in_process(split(lung, 3), disclosure=OPEN)
    grid = np.sort(lung.time.unique()).astype(float)
    assert np.array_equal(grid, LUNG_GRID)
    result = fedstats.KaplanMeier("time", "status", grid=grid, weights="w").fit(fed)
    positive = lung[lung.w > 0]
    survival, bounds, variance = lifelines_fit(positive.time, positive.status, grid, positive.w)
    reached = grid <= positive.time.max()
    got = result.survival_function_["all"].to_numpy()
    assert np.max(np.abs(got[reached] - survival[reached])) <= TOLERANCE
    assert np.max(np.abs(result.greenwood_["all"].to_numpy()[reached] - variance[reached])) <= (
        TOLERANCE
    )
    lower = result.confidence_interval_["lower"]["all"].to_numpy()
    upper = result.confidence_interval_["upper"]["all"].to_numpy()
    assert np.nanmax(np.abs(lower[reached] - bounds[reached, 0])) <= TOLERANCE
    assert np.nanmax(np.abs(upper[reached] - bounds[reached, 1])) <= TOLERANCE
    table = result.event_table
    assert table[("all", "at_risk")].iloc[0] == lung.w.sum()
    assert table[("all", "events")].sum() == (lung.w * lung.status).sum()
    assert "frequency weights 'w'" in result.summary()


def test_weighted_fit_equals_the_unweighted_fit_of_the_expanded_rows(lung):
    """The same curve as lifelines and fedstats give for the rows repeated ``w`` times, by
    sex over two sites (with three or four, a site ends the women's curve early)."""
    grid = np.sort(lung.time.unique()).astype(float)
    fed = fedstats.Federation.in_process(split(lung, 2), disclosure=OPEN)
    weighted = fedstats.KaplanMeier("time", "status", group="sex", grid=grid, weights="w").fit(fed)
    expanded = lung.loc[lung.index.repeat(lung.w)].reset_index(drop=True)
    unweighted = fedstats.KaplanMeier("time", "status", group="sex", grid=grid).fit(
        fedstats.Federation.in_process(split(expanded, 2), disclosure=OPEN)
    )
    for frame in ("survival_function_", "greenwood_"):
        a, b = getattr(weighted, frame).to_numpy(), getattr(unweighted, frame).to_numpy()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nanmax(np.abs(a - b)) <= TOLERANCE
    for sex in (1, 2):
        rows = expanded[expanded.sex == sex]
        survival, bounds, _ = lifelines_fit(rows.time, rows.status, grid)
        reached = grid <= rows.time.max()
        got = weighted.survival_function_[sex].to_numpy()
        assert np.max(np.abs(got[reached] - survival[reached])) <= TOLERANCE
        lower = weighted.confidence_interval_["lower"][sex].to_numpy()
        assert np.nanmax(np.abs(lower[reached] - bounds[reached, 0])) <= TOLERANCE


def test_non_integer_weights_equal_lifelines_on_waltons():
    """lifelines' Waltons fly data with non-integer weights (lifelines accepts them with a
    warning). Only the curve is compared: lifelines' Greenwood variance casts the weighted
    number at risk to an unsigned integer, so it is no oracle for non-integer weights."""
    frame = load_waltons()
    rng = np.random.default_rng(2)
    frame = frame.assign(w=rng.uniform(0.5, 2.0, len(frame)))
    frame = on_grid(frame, WALTONS_GRID, "T", "E")  # every 15 days; nothing is censored
    fed = fedstats.Federation.in_process(split(frame, 3), disclosure=OPEN)
    grid = np.sort(frame["T"].unique()).astype(float)
    result = fedstats.KaplanMeier("T", "E", grid=grid, weights="w").fit(fed)
    with pytest.warns(Warning):
        survival, _, _ = lifelines_fit(frame["T"], frame["E"], grid, frame.w)
    assert np.max(np.abs(result.survival_function_["all"].to_numpy() - survival)) <= TOLERANCE
    assert result.event_table[("all", "at_risk")].iloc[0] == pytest.approx(frame.w.sum())


def weighted_site(n: int = 400, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    event_time = rng.exponential(500, n)
    censor = rng.uniform(100, 1200, n)
    return pd.DataFrame(
        {
            "days": np.ceil(np.minimum(event_time, censor)),
            "died": (event_time <= censor).astype(int),
            "w": rng.integers(1, 4, n),
        }
    )


def released(silo: fedstats.Silo, args: dict) -> dict:
    request = {"task": TASK, "args": {"time": "days", "event": "died", "group": None, **args}}
    return codec.decode(silo.handle(codec.encode(request)))


def test_a_weighted_count_stands_for_k_rows_not_k_weight():
    """Default policy (k = 10): an interval whose deaths are 4 rows of weight 3 sums to 12,
    but stands for 4 patients, so the curve ends before it, as it would unweighted."""
    frame = weighted_site()
    grid = np.arange(30.0, 1230.0, 30.0)
    silo = fedstats.Silo("a", frame)
    weighted = released(silo, {"grid": grid, "weights": "w"})["result"]
    plain = released(silo, {"grid": grid})["result"]
    reached = plain["at_risk"][0] > 0
    assert np.array_equal(weighted["at_risk"][0] > 0, reached)  # the same horizon: rows count
    coarse = np.searchsorted(grid, frame.days, side="left")
    for j in np.flatnonzero(reached):
        rows = (coarse == j) & (frame.died == 1)
        assert weighted["events"][0, j] == frame.w[rows].sum()
        assert rows.sum() == 0 or rows.sum() >= 10
    assert weighted["truncated"] == plain["truncated"]


def test_a_row_dominating_a_weighted_count_ends_the_curve_before_it():
    """Weights 1 to 3, and one patient of weight 200: the column passes the mode and
    dominance rules and no row holds 1/k of the total, but the deaths of the interval where
    that patient dies are mostly its weight, so the curve ends before that interval."""
    frame = weighted_site(n=2000, seed=8)
    heavy = int(np.flatnonzero((frame.died == 1) & (frame.days > 400) & (frame.days < 500))[0])
    frame.loc[heavy, "w"] = 200
    grid = np.arange(30.0, 1230.0, 30.0)
    silo = fedstats.Silo("a", frame, policy=fedstats.DisclosurePolicy(min_count=10, k_cell=3))
    reply = released(silo, {"grid": grid, "weights": "w"})
    assert reply["status"] == "ok"
    point = int(np.searchsorted(grid, frame.days[heavy], side="left"))
    assert reply["result"]["at_risk"][0, point - 1] > 0  # released up to the interval before
    assert not reply["result"]["at_risk"][0, point:].any()
    assert not reply["result"]["events"][0, point:].any()
    unweighted = released(silo, {"grid": grid})["result"]
    assert unweighted["at_risk"][0, point] > 0  # unweighted, the curve goes on


def test_rows_of_weight_zero_add_nothing(lung):
    """Three sites, k_cell = 2: rows of weight 0 change no released count."""
    fed = fedstats.Federation.in_process(split(lung, 3), disclosure=OPEN)
    grid = np.sort(lung.time.unique()).astype(float)
    with_zeros = fedstats.KaplanMeier("time", "status", grid=grid, weights="w").fit(fed)
    kept = lung[lung.w > 0].reset_index(drop=True)
    without = fedstats.KaplanMeier("time", "status", grid=grid, weights="w").fit(
        fedstats.Federation.in_process(split(kept, 3), disclosure=OPEN)
    )
    assert np.array_equal(with_zeros.counts.at_risk, without.counts.at_risk)
    assert np.array_equal(with_zeros.counts.events, without.counts.events)
    assert sum(with_zeros.counts.n_obs.values()) == len(lung)  # every row read, none lost


def test_a_grid_of_every_raw_time_ends_the_weighted_curve_at_the_first_single_death():
    """The configuration the parity tests used before ``k_cell >= 2``: a grid of every raw
    lung time. A death interval of one row releases that row's weight alone (the dominance
    rule, one row above ``1 / k_cell`` of the count), so the weighted curve ends at the latest
    before the first such interval, while the unweighted one (``min_count=1``) goes on."""
    frame = load_lung()[["time", "status"]]
    frame = frame.assign(w=np.random.default_rng(41).integers(1, 6, len(frame)))
    grid = np.sort(frame.time.unique()).astype(float)
    silo = fedstats.Silo("a", frame.rename(columns={"time": "days", "status": "died"}),
                         policy=OPEN)  # fmt: skip
    deaths = frame[frame.status == 1].groupby("time").size().reindex(grid, fill_value=0)
    first = int(np.flatnonzero(deaths.to_numpy() == 1)[0])
    weighted = released(silo, {"grid": grid, "weights": "w"})["result"]
    assert not weighted["at_risk"][0, first:].any()
    assert weighted["truncated"] > 0
    assert released(silo, {"grid": grid})["result"]["at_risk"][0, first] > 0


def test_bad_weights_are_typed_errors_naming_site_and_column(lung):
    frames = split(lung, 3)
    frames["s1"].loc[4, "w"] = -1
    fed = fedstats.Federation.in_process(frames, disclosure=OPEN)
    grid = np.sort(lung.time.unique()).astype(float)
    with pytest.raises(fedstats.InconsistentColumnError, match=r"site 's1'.*'w'.*>= 0"):
        fedstats.KaplanMeier("time", "status", grid=grid, weights="w").fit(fed)
    with pytest.raises(fedstats.MissingColumnError, match="'weight'"):
        fedstats.KaplanMeier("time", "status", grid=grid, weights="weight").fit(fed)
    with pytest.raises(fedstats.StudyConfigurationError, match="weights="):
        fedstats.KaplanMeier("time", "status", grid=grid, weights=3)  # type: ignore[arg-type]
