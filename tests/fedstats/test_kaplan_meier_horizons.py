"""A pooled Kaplan–Meier value is the pooled (all-sites) estimate, or it is "not released".

Each site ends its counts at its safe horizon; a sum past one site's horizon
is the other sites' counts only. The oracle is lifelines' Kaplan–Meier on
the pooled data of every site, coarsened to the grid (each time up to the
next grid point, times past the grid censored at its end): wherever the
federated curve has a value, it equals that oracle, value and interval;
everywhere else it is NaN, a SurvivalHorizonWarning names the sites and
their horizons, and the record says from where the curve is not released.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from lifelines import KaplanMeierFitter

import fedstats
from fedstats import datasets
from studyfiles.fit_records import CurveRecord

TCGA_REGIONS = [f"region_{r}" for r in range(6)]


def pooled_oracle(frames, time, event, grid, rows=None):
    """lifelines' curve and bounds at the grid times on every site's rows, coarsened to the
    grid; the pooled number of events up to each grid time, and at risk at each."""
    every = pd.concat(frames.values(), ignore_index=True)
    if rows is not None:
        every = every[rows(every)]
    t = every[time].to_numpy(dtype=float)
    e = every[event].to_numpy(dtype=bool) & (t <= grid[-1])
    coarse = grid[np.minimum(np.searchsorted(grid, t, side="left"), len(grid) - 1)]
    events_by = np.array([int((e & (coarse <= g)).sum()) for g in grid])
    at_risk = np.array([int((coarse >= g).sum()) for g in grid])
    if len(t) == 0:
        return np.full(len(grid), np.nan), np.full((len(grid), 2), np.nan), events_by, at_risk
    fitter = KaplanMeierFitter().fit(coarse, e)
    bounds = fitter.confidence_interval_.reindex(grid, method="ffill").to_numpy()
    return fitter.survival_function_at_times(grid).to_numpy(), bounds, events_by, at_risk


def assert_pooled_or_not_released(result, frames, time, event, rows_of=None, deferred=False):
    """Every released value equals the pooled oracle; every other one is NaN; never S = 1
    with a zero-width interval where the pooled data hold events. (Where nobody is left at
    risk in the pooled data the curve is NaN, released or not: fedstats' convention.)"""
    grid = result.grid
    for group in result.survival_function_.columns:
        rows = None if rows_of is None else rows_of(group)
        survival, bounds, events_by, at_risk = pooled_oracle(frames, time, event, grid, rows)
        got = result.survival_function_[group].to_numpy()
        low = result.confidence_interval_["lower"][group].to_numpy()
        high = result.confidence_interval_["upper"][group].to_numpy()
        released = result.released_[group].to_numpy()
        reached = result.reached_[group].to_numpy()
        assert (np.diff(reached.astype(int)) <= 0).all()  # every site reaches up to a point
        if not deferred:
            assert (released == reached).all()
        else:  # deferred deaths: S = 1 before the first released death is not known
            assert (released == (reached & (result.survival_reaching_sites_[group] != 1.0))).all()
        assert np.isnan(got[~released]).all() and np.isnan(low[~released]).all()
        assert np.isnan(high[~released]).all()
        assert np.isnan(got[at_risk == 0]).all()
        released = released & (at_risk > 0)
        if released.any() and not deferred:  # a deferred curve is that of the deferred times
            assert np.allclose(got[released], survival[released], atol=1e-10, rtol=0)
            # where S = 1 (no event yet) lifelines' bounds may be NaN; both are [1, 1] there
            bounds = np.where(np.isnan(bounds) & (survival == 1.0)[:, None], 1.0, bounds)
            np.testing.assert_allclose(low[released], bounds[released, 0], atol=1e-8, rtol=0)
            np.testing.assert_allclose(high[released], bounds[released, 1], atol=1e-8, rtol=0)
        certain = (got == 1.0) & (low == high)
        assert not (certain & (events_by > 0)).any(), (group, got, events_by)


def fit_warned(model, federation):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = model.fit(federation)
    return result, [
        str(w.message) for w in caught if issubclass(w.category, fedstats.SurvivalHorizonWarning)
    ]


@pytest.fixture(scope="module")
def brca():
    return dict(datasets.tcga_brca().frames)


@pytest.mark.parametrize("sparse_events", ["end", "defer"])
def test_tcga_brca_yearly_curve_is_not_released_and_names_the_sites_that_stop_it(
    brca, sparse_events
):
    """Six regions, yearly to ten years: about 20 pooled deaths in year 1, but five regions
    (end) stop before 365, so S(365) was one region's 1.0000 [1.0000, 1.0000]."""
    assert sorted(brca) == TCGA_REGIONS
    model = fedstats.KaplanMeier(
        "time", "event", width=365, horizon=3650, sparse_events=sparse_events
    )
    result, messages = fit_warned(model, fedstats.Federation.in_process(brca))
    _, _, events_by, _ = pooled_oracle(brca, "time", "event", result.grid)
    assert events_by[0] >= 15  # the pooled data do have deaths in the first year

    assert_pooled_or_not_released(result, brca, "time", "event")
    assert np.isnan(result.survival_function_.loc[365.0, "all"])
    assert not result.released_["all"].any()
    # the previous value is still there, labelled as what it is
    assert result.survival_reaching_sites_.loc[365.0, "all"] == 1.0

    expected = {
        "end": {**dict.fromkeys(TCGA_REGIONS[:5]), "region_5": 365.0},
        "defer": {
            "region_0": 2555.0,
            "region_1": 2555.0,
            "region_2": 1095.0,
            "region_3": 1095.0,
            "region_4": None,
            "region_5": 365.0,
        },
    }[sparse_events]
    assert result.horizons_ == {site: {"all": h} for site, h in expected.items()}
    # each site's horizon is where its released numbers at risk end (truncated sites)
    (message,) = messages
    assert "group all is not released from time 365" in message
    before = [s for s, h in expected.items() if h is None]
    for site in before:
        assert f"{site} before the first grid time (365)" in message
    for site in set(TCGA_REGIONS) - set(before):
        assert site not in message  # it reaches 365: not what stops the curve there
    assert result.horizon_warnings == [message]

    text = result.summary()
    assert "not released" in text and all(site in text for site in before)
    record = result.to_record()
    assert record["not_released_from"] == {"all": 365.0}
    assert record["horizons"] == result.horizons_
    assert CurveRecord.model_validate(record).released_at("all") == [False] * 10
    assert np.isnan(result.median_survival_time_["all"])  # not "never reached" (inf)


def test_tcga_brca_curve_is_released_up_to_the_earliest_horizon_and_equals_lifelines(brca):
    """Four regions, two-yearly, k = 3: the curve is released to 1460 (regions 2 and 3 stop
    there) and equals lifelines on the four regions' pooled data; the plot says so."""
    import matplotlib

    matplotlib.use("Agg")
    frames = {s: brca[s] for s in TCGA_REGIONS[:4]}
    federation = fedstats.Federation.in_process(
        frames, disclosure=fedstats.DisclosurePolicy(min_count=3)
    )
    result, messages = fit_warned(
        fedstats.KaplanMeier("time", "event", width=730, horizon=3650), federation
    )
    assert result.released_["all"].tolist() == [True, True, False, False, False]
    assert_pooled_or_not_released(result, frames, "time", "event")
    assert result.horizons_ == {
        "region_0": {"all": 3650.0}, "region_1": {"all": 3650.0},
        "region_2": {"all": 1460.0}, "region_3": {"all": 1460.0},
    }  # fmt: skip
    (message,) = messages
    assert "not released from time 2190" in message
    assert "region_2 at 1460, region_3 at 1460" in message and "region_0" not in message
    figure = result.plot()
    title = figure.axes[0].get_title(loc="left")
    assert "not released from 2190" in title and "region_2 at 1460" in title
    assert len(figure.axes[0].lines) == 1  # the curve, drawn only where released


def test_a_curve_every_site_reaches_is_released_whole_without_warning():
    rng = np.random.default_rng(4)
    frames = {
        s: pd.DataFrame({"t": rng.exponential(10.0, 400), "e": rng.random(400) < 0.7})
        for s in ("a", "b")
    }
    grid = [2.0, 4.0, 6.0]
    result, messages = fit_warned(
        fedstats.KaplanMeier("t", "e", grid=grid), fedstats.Federation.in_process(frames)
    )
    assert messages == [] and result.horizon_warnings == []
    assert result.released_["all"].all()
    assert result.horizons_ == {"a": {"all": 6.0}, "b": {"all": 6.0}}
    assert result.to_record()["not_released_from"] == {"all": None}
    assert_pooled_or_not_released(result, frames, "t", "e")


def test_secure_aggregation_with_sites_cut_releases_nothing_and_says_why(brca):
    frames = {s: brca[s] for s in TCGA_REGIONS[:4]}
    federation = fedstats.Federation.in_process(
        frames, disclosure=fedstats.DisclosurePolicy(min_count=3)
    )
    model = fedstats.KaplanMeier("time", "event", width=730, horizon=3650)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = model.fit(federation, secure_aggregation=fedstats.SecureAggregation())
    assert result.horizons_ is None and not result.released_["all"].any()
    assert result.survival_function_["all"].isna().all()
    named = [str(w.message) for w in caught if w.category is fedstats.SurvivalHorizonWarning]
    assert len(named) == 1 and "secure aggregation hides where each site's counts stop" in named[0]
    record = result.to_record()
    assert record["horizons"] is None and record["not_released_from"] == {"all": 730.0}


def test_a_record_holding_a_value_where_the_curve_is_not_released_is_refused(brca):
    from studyfiles.errors import FitRecordError
    from studyfiles.fit_records import checked_curve_record

    result, _ = fit_warned(
        fedstats.KaplanMeier("time", "event", width=365, horizon=3650),
        fedstats.Federation.in_process(brca),
    )
    record = result.to_record()
    record["survival"] = {"all": [1.0] + [None] * 9}  # the old S(365) = 1
    with pytest.raises(FitRecordError, match=r"survival.all holds values at \[365"):
        checked_curve_record(record)


# ------------------------------------------------------------------ synthetic federations
@st.composite
def federations(draw):
    """2 to 4 sites of 1 to 250 patients: exponential deaths, uniform censoring, a 0/1 group."""
    sites = draw(st.integers(2, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    frames = {}
    for s in range(sites):
        n = draw(st.sampled_from([1, 8, 30, 80, 250]))  # small sites stop early, large ones late
        scale = draw(st.sampled_from([2.0, 5.0, 20.0]))
        death = rng.exponential(scale, n)
        censor = rng.uniform(0.0, draw(st.sampled_from([3.0, 8.0, 30.0])), n)
        frames[f"s{s}"] = pd.DataFrame(
            {"t": np.minimum(death, censor), "e": death <= censor, "g": rng.integers(0, 2, n)}
        )
    return frames


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=federations(),
    k=st.sampled_from([1, 3, 5, 10]),
    grouped=st.booleans(),
    grid=st.sampled_from([[1.0, 2.0, 3.0, 4.0, 5.0], [0.5, 1.0, 2.0, 4.0], [3.0, 6.0]]),
    sparse_events=st.sampled_from(["end", "end", "defer"]),
)
def test_released_values_are_the_pooled_curve_over_every_site(
    frames, k, grouped, grid, sparse_events
):
    """Ended curves: every released value is lifelines' pooled one. Deferred curves (the
    Kaplan–Meier estimate of the deferred times, compared with lifelines in
    test_kaplan_meier.py): never S = 1 with a zero-width interval where the pooled data
    hold deaths."""
    federation = fedstats.Federation.in_process(
        frames, disclosure=fedstats.DisclosurePolicy(min_count=k)
    )
    model = fedstats.KaplanMeier(
        "t",
        "e",
        grid=grid,
        group="g" if grouped else None,
        levels=[0, 1] if grouped else None,
        sparse_events=sparse_events,
    )
    try:
        result, messages = fit_warned(model, federation)
    except fedstats.DisclosureError:
        event("refused")
        return  # a group of 1 to k - 1 patients at a site is refused whole: nothing released
    share = result.released_.to_numpy().mean()
    event("released: " + ("all" if share == 1 else "none" if share == 0 else "part"))
    rows_of = (lambda group: lambda frame: frame["g"] == group) if grouped else None
    deferred = sparse_events == "defer"
    assert_pooled_or_not_released(result, frames, "t", "e", rows_of, deferred)
    released = result.reached_
    unknown = [m for m in messages if "is not released up to time" in m]  # S = 1, deferred
    assert len(unknown) == int((result.reached_ & ~result.released_).any().sum())
    messages = [m for m in messages if m not in unknown]
    assert len(messages) == int((~released.all()).sum())  # one per group cut short
    for group in released.columns[~released.all().to_numpy()]:
        first = float(released.index[~released[group].to_numpy()][0])
        (message,) = [m for m in messages if f"group {group} is" in m]
        assert f"not released from time {first:g}" in message
        for site, horizons in result.horizons_.items():
            h = horizons[group]
            if h is None:
                assert f"{site} before the first grid time ({grid[0]:g})" in message
            elif h < first:
                assert f"{site} at {h:g}" in message
            else:
                assert f"{site} " not in message


def test_a_private_curve_does_not_release_s_one_where_the_noise_can_hide_deaths(tmp_path):
    """Two sites with 3 deaths each in the first interval: at epsilon 1 the summed noisy
    deaths clip to 0 there for some seed, and the curve then read 1 with the interval
    [1, 1] although 6 patients died; now that point is not released, with a privacy
    utility warning, and the points after the first released death are."""
    import accounting

    rng = np.random.default_rng(2)
    frames = {}
    for site in ("a", "b"):
        t = np.r_[np.full(3, 0.5), rng.uniform(1.0, 6.0, 300)]
        frames[site] = pd.DataFrame({"t": t, "e": np.r_[np.ones(3), rng.random(300) < 0.5]})
    books = {}
    for site in frames:
        books[site] = accounting.Ledger(tmp_path / f"{site}.ledger", durability="normal")
        books[site].set_budget(
            accounting.Scope(unit="patient", owner=site, study="study"), epsilon=1e6, delta=1e-6
        )
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-6)
    for seed in range(200):
        federation = fedstats.Federation.in_process(frames, ledgers=books, noise_seed=seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fedstats.KaplanMeier("t", "e", grid=[1.0, 3.0, 6.0], privacy=privacy).fit(
                federation
            )
        if result.survival_reaching_sites_.loc[1.0, "all"] == 1.0:
            break
    else:
        pytest.fail("no seed clipped the first interval's noisy deaths to 0")
    assert result.released_["all"].tolist()[0] is False
    assert np.isnan(result.survival_function_.loc[1.0, "all"])
    assert np.isnan(result.confidence_interval_["lower"].loc[1.0, "all"])
    (message,) = [m for m in result.utility_warnings if "not released up to time 1" in m]
    assert "privacy noise" in message
    assert any(
        issubclass(w.category, fedstats.PrivacyUtilityWarning) and str(w.message) == message
        for w in caught
    )
    later = result.survival_function_["all"].iloc[1:]
    assert later.notna().all() and (later < 1).all()
    assert result.to_record()["released"]["all"] == [False, True, True]
