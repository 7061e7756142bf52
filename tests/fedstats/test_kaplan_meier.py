"""Federated Kaplan–Meier and log-rank equal lifelines; released counts respect the threshold."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifelines import KaplanMeierFitter
from lifelines.datasets import load_rossi
from lifelines.statistics import multivariate_logrank_test

import fedstats
from fedstats import datasets
from fedstats.contract import codec
from fedstats.contract.tasks.survival import TASK

OPEN = fedstats.DisclosurePolicy(min_count=1)


def split(frame: pd.DataFrame, site: np.ndarray) -> dict[str, pd.DataFrame]:
    return {
        f"s{k}": part.drop(columns="_site").reset_index(drop=True)
        for k, part in frame.assign(_site=site).groupby("_site")
    }


@pytest.fixture(scope="module")
def rossi():
    frame = load_rossi()
    frame["prio_band"] = np.select([frame.prio == 0, frame.prio <= 2], ["none", "few"], "many")
    return frame, np.arange(len(frame)) % 4


def lifelines_curve(time, event, grid):
    fitter = KaplanMeierFitter().fit(time, event)
    bounds = fitter.confidence_interval_.reindex(grid, method="ffill")
    return fitter.survival_function_at_times(grid).to_numpy(), bounds.to_numpy()


def test_native_grid_curves_and_intervals_equal_lifelines(rossi):
    frame, site = rossi
    fed = fedstats.Federation.in_process(split(frame, site), disclosure=OPEN)
    grid = np.sort(frame["week"].unique()).astype(float)
    overall = fedstats.KaplanMeier("week", "arrest", grid=grid).fit(fed)
    survival, bounds = lifelines_curve(frame.week, frame.arrest, grid)
    assert np.max(np.abs(overall.survival_function_["all"].to_numpy() - survival)) < 1e-8
    assert np.max(np.abs(overall.confidence_interval_["lower"]["all"] - bounds[:, 0])) < 1e-8
    assert np.max(np.abs(overall.confidence_interval_["upper"]["all"] - bounds[:, 1])) < 1e-8
    by_fin = fedstats.KaplanMeier("week", "arrest", group="fin", grid=grid).fit(fed)
    for level in (0, 1):
        rows = frame.fin == level
        survival, bounds = lifelines_curve(frame.week[rows], frame.arrest[rows], grid)
        assert np.max(np.abs(by_fin.survival_function_[level].to_numpy() - survival)) < 1e-8
        assert np.max(np.abs(by_fin.confidence_interval_["lower"][level] - bounds[:, 0])) < 1e-8
    table = by_fin.event_table
    assert table[(1, "events")].sum() == frame.arrest[frame.fin == 1].sum()
    assert table[(0, "at_risk")].iloc[0] == (frame.fin == 0).sum()


def test_coarse_grid_equals_lifelines_on_coarsened_times(rossi):
    frame, site = rossi
    fed = fedstats.Federation.in_process(split(frame, site), disclosure=OPEN)
    result = fedstats.KaplanMeier("week", "arrest", width=4, horizon=52).fit(fed)
    grid = result.grid
    assert list(grid) == [4.0 * i for i in range(1, 14)]
    coarse = grid[np.searchsorted(grid, frame.week, side="left")]
    survival, _ = lifelines_curve(coarse, frame.arrest, grid)
    assert np.max(np.abs(result.survival_function_["all"].to_numpy() - survival)) < 1e-8
    assert result.median_survival_time_["all"] == np.inf  # 74 % never arrested in a year


@pytest.mark.parametrize("group", ["fin", "prio_band"])
def test_logrank_equals_lifelines(rossi, group):
    frame, site = rossi
    fed = fedstats.Federation.in_process(split(frame, site), disclosure=OPEN)
    grid = np.sort(frame["week"].unique()).astype(float)
    result = fedstats.logrank_test(fed, "week", "arrest", group, grid=grid)
    reference = multivariate_logrank_test(frame.week, frame[group], frame.arrest)
    assert abs(result.statistic - reference.test_statistic) < 1e-8
    assert abs(result.p_value - reference.p_value) < 1e-8
    assert result.dof == frame[group].nunique() - 1
    assert result.observed.sum() == frame.arrest.sum()


def recording_federation(frames, policy=None, ledgers=None):
    replies: list[tuple[str, dict]] = []

    def transport(name, silo):
        def send(request: bytes) -> bytes:
            reply = silo.handle(request)
            task = codec.decode(request)["task"]
            replies.append((task, codec.decode(reply)))
            return reply

        return send

    silos = {
        name: fedstats.Silo(name, frame, policy=policy, ledger=(ledgers or {}).get(name))
        for name, frame in frames.items()
    }
    return fedstats.Federation({n: transport(n, s) for n, s in silos.items()}), replies


def synthetic_sites(seed: int = 11) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    frames = {}
    for site, n in (("a", 900), ("b", 600), ("c", 400)):
        event_time = rng.exponential(900, n)
        censor = rng.uniform(200, 1500, n)
        frames[site] = pd.DataFrame(
            {"days": np.ceil(np.minimum(event_time, censor)), "died": event_time <= censor}
        )
    return frames


@pytest.mark.parametrize("width", [7, 91])
def test_default_threshold_no_released_count_below_k(width):
    """Default policy: every released non-zero count stands for at least k patients.

    A weekly grid ends each site's curve at its first week with 1 to 9 deaths
    (here the first week: nothing is released); a quarterly one runs for
    years, and equals lifelines on the data censored at each site's horizon.
    """
    frames = synthetic_sites()
    k = fedstats.DisclosurePolicy().min_count
    fed, replies = recording_federation(frames)
    result = fedstats.KaplanMeier("days", "died", width=width, horizon=1500).fit(fed)
    released = [reply["result"] for task, reply in replies if task == TASK]
    assert len(released) == len(frames)
    for counts in released:
        for name in ("at_risk", "events"):
            values = counts[name][counts[name] > 0]
            assert (values >= k).all(), (name, values.min())
    # The same curve from lifelines on each site's data censored at its horizon.
    grid, pieces = result.grid, []
    for (_, frame), counts in zip(frames.items(), released, strict=True):
        last = np.flatnonzero(counts["at_risk"][0] > 0)
        horizon = grid[last[-1]] if len(last) else -1.0
        coarse = grid[np.minimum(np.searchsorted(grid, frame.days, side="left"), len(grid) - 1)]
        event = frame.died & (frame.days <= grid[-1]) & (coarse <= horizon)
        pieces.append(pd.DataFrame({"t": np.minimum(coarse, max(horizon, 0.0)), "e": event}))
        assert counts["truncated"] == int((coarse > horizon).sum())
    reached = result.event_table[("all", "at_risk")].to_numpy() > 0
    if width == 7:  # about 7 deaths in a site's first week: no site can release a step
        assert not reached.any()
        assert sum(result.counts.truncated.values()) == sum(len(f) for f in frames.values())
        return
    assert reached.sum() >= 10  # about 1000 of the 1500 days
    # The curve over the sites reaching each time is lifelines on the horizon-censored data...
    pooled = pd.concat(pieces, ignore_index=True)
    survival, _ = lifelines_curve(pooled.t, pooled.e, grid)
    partial = result.survival_reaching_sites_["all"].to_numpy()
    assert np.max(np.abs(partial[reached] - survival[reached])) < 1e-8
    # ...but the pooled curve is released only up to the earliest site's horizon, where it is
    # lifelines on all the (coarsened) data; past it, "not released".
    reach = min(np.flatnonzero(c["at_risk"][0] > 0)[-1] for c in released)
    every = pd.concat(frames.values(), ignore_index=True)
    coarse = grid[np.minimum(np.searchsorted(grid, every.days, side="left"), len(grid) - 1)]
    truth, _ = lifelines_curve(coarse, every.died & (every.days <= grid[-1]), grid)
    got = result.survival_function_["all"].to_numpy()
    assert result.released_["all"].tolist() == [j <= reach for j in range(len(grid))]
    assert np.max(np.abs(got[: reach + 1] - truth[: reach + 1])) < 1e-8
    assert np.isnan(got[reach + 1 :]).all() and reach + 1 < reached.sum()


def test_a_site_with_too_few_events_releases_no_curve():
    region = datasets.tcga_brca().frames["region_5"]  # 51 patients, 7 deaths
    fed = fedstats.Federation.in_process({"region_5": region})
    result = fedstats.KaplanMeier("time", "event", width=365, horizon=3650).fit(fed)
    table = result.event_table
    assert not table[("all", "events")].any()  # its 7 deaths never make an interval of 10
    assert table[("all", "at_risk")].tolist() == [51] + [0] * 9  # none in the first year
    assert result.counts.truncated == {"region_5": int((region.time > 365).sum())}
    curve = result.survival_function_["all"]
    assert curve.iloc[0] == 1.0 and curve.iloc[1:].isna().all()


def test_tail_is_censored_where_fewer_than_k_remain():
    frame = pd.DataFrame({"t": np.arange(1, 31, dtype=float), "e": [0] * 30})
    frame.loc[:9, "e"] = 1  # ten events at times 1..10, all in the first interval
    fed = fedstats.Federation.in_process({"a": frame})
    result = fedstats.KaplanMeier("t", "e", grid=[10.0, 20.0, 25.0, 30.0]).fit(fed)
    table = result.event_table
    assert table[("all", "at_risk")].tolist() == [30, 20, 10, 0]  # 5 left at 30 < k: cut
    assert table[("all", "events")].tolist() == [10, 0, 0, 0]
    # 5 patients are censored early; a count of 1 to k - 1 leaves the site as k ("at most k")
    assert result.counts.truncated == {"a": 10}
    assert np.isnan(result.survival_function_["all"].iloc[-1])


def test_bad_inputs_are_typed_errors(rossi):
    frame, site = rossi
    with pytest.raises(fedstats.StudyConfigurationError, match="time grid"):
        fedstats.KaplanMeier("week", "arrest")
    with pytest.raises(fedstats.StudyConfigurationError, match="increasing"):
        fedstats.KaplanMeier("week", "arrest", grid=[3.0, 2.0])
    bad = split(frame, site)
    bad["s3"].loc[5, "arrest"] = 3
    fed = fedstats.Federation.in_process(bad, disclosure=OPEN)
    with pytest.raises(fedstats.NonBinaryOutcomeError, match=r"site 's3'.*'arrest'"):
        fedstats.KaplanMeier("week", "arrest", width=1, horizon=52).fit(fed)
    with pytest.raises(fedstats.MissingColumnError, match="'weeks'"):
        fedstats.KaplanMeier("weeks", "arrest", width=1, horizon=52).fit(fed)


# ------------------------------------------------------------------ record-level privacy
def dp_sites(n_per_site: int = 4000, seed: int = 5) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    frames = {}
    for site in ("a", "b", "c"):
        arm = rng.integers(0, 2, n_per_site)
        event_time = rng.exponential(np.where(arm == 1, 700, 500))
        censor = rng.uniform(100, 1500, n_per_site)
        frames[site] = pd.DataFrame(
            {"days": np.minimum(event_time, censor), "died": event_time <= censor, "arm": arm}
        )
    return frames


def ledgers_for(tmp_path, sites, epsilon):
    import accounting

    ledgers = {}
    for site in sites:
        ledger = accounting.Ledger(tmp_path / f"{site}.ledger")
        ledger.set_budget(
            accounting.Scope(unit="patient", owner=site, study="study"), epsilon=epsilon, delta=1e-6
        )
        ledgers[site] = ledger
    return ledgers


def test_private_curves_are_charged_before_release_and_stay_close(tmp_path):
    import dp_accounting

    import accounting

    frames = dp_sites()
    ledgers = ledgers_for(tmp_path, frames, epsilon=1.6)  # two releases cost 1.45, three 1.81
    fed = fedstats.Federation.in_process(frames, ledgers=ledgers, noise_seed=1)
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-6)
    private = fedstats.KaplanMeier(
        "days", "died", group="arm", levels=[0, 1], width=30, horizon=1500, privacy=privacy
    ).fit(fed)
    sigma = private.counts.noise_multiplier
    assert sigma == pytest.approx(accounting.calibrate_gaussian(1.0, 1e-6))
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    expected = accountant.get_epsilon(1e-6)
    for site, ledger in ledgers.items():
        scope = accounting.Scope(unit="patient", owner=site, study="study")
        assert ledger.spent(scope).epsilon == pytest.approx(expected, rel=1e-9)
        assert private.counts.epsilon_spent[site] == pytest.approx(expected, rel=1e-9)
    # the yardstick: each arm's exact curve up to its own safe horizon (a grouped exact
    # request cuts every arm where the first must end, so each arm is asked on its own)
    exact = pd.DataFrame(
        {
            arm: fedstats.KaplanMeier("days", "died", width=30, horizon=1500)
            .fit(fedstats.Federation.in_process({s: f[f.arm == arm] for s, f in frames.items()}))
            .survival_function_.iloc[:, 0]
            for arm in (0, 1)
        }
    )
    exact.columns = private.survival_function_.columns
    reached = exact.notna() & private.survival_function_.notna()
    difference = (private.survival_function_ - exact)[reached].abs()
    assert np.nanmax(difference.to_numpy()) < 0.03
    test = fedstats.logrank_test(
        fed, "days", "died", "arm", levels=[0, 1], width=30, horizon=1500, privacy=privacy
    )
    assert test.p_value < 1e-6  # the arms differ (hazard ratio 5/7)
    with pytest.raises(fedstats.BudgetExceededError):  # a third release would pass 1.6
        fedstats.KaplanMeier("days", "died", width=30, horizon=1500, privacy=privacy).fit(fed)
    with pytest.raises(fedstats.StudyConfigurationError, match="levels"):
        fedstats.KaplanMeier("days", "died", group="arm", width=30, horizon=1500,
                             privacy=privacy).fit(fed)  # fmt: skip


def test_private_reply_holds_only_noisy_deaths_and_censorings(tmp_path):
    frames = dp_sites(n_per_site=500)
    ledgers = ledgers_for(tmp_path, frames, epsilon=5.0)
    fed, replies = recording_federation(frames, ledgers=ledgers)
    privacy = fedstats.RecordDP(noise_multiplier=3.0)
    fedstats.KaplanMeier("days", "died", width=100, horizon=1500, privacy=privacy).fit(fed)
    results = [reply["result"] for task, reply in replies if task == TASK]
    assert len(results) == 3
    for result in results:
        assert set(result) == {"events", "censored", "dp_epsilon_spent", "dp_budget_epsilon",
                               "dp_fixed_seed", "dp_ledger_entries", "dp_ledger_head"}  # fmt: skip
        assert not np.allclose(result["events"], np.round(result["events"]))  # noised


def test_a_private_curve_records_each_sites_ledger_chain_head(tmp_path):
    """Each site's reply carries its ledger's head after the charge; the curve's record keeps
    them so the study record can later show a ledger rewritten after the release."""
    frames = dp_sites(n_per_site=500)
    ledgers = ledgers_for(tmp_path, frames, epsilon=5.0)
    fed = fedstats.Federation.in_process(frames, study="study", ledgers=ledgers)
    privacy = fedstats.RecordDP(noise_multiplier=3.0)
    result = fedstats.KaplanMeier("days", "died", width=100, horizon=1500, privacy=privacy).fit(fed)
    heads = result.to_record()["ledger_heads"]
    assert set(heads) == set(frames)
    for site, ledger in ledgers.items():
        (head,) = ledger.heads()
        assert heads[site] == {"entries": head.entries, "head": head.head}
        assert head.entries == 1


def test_summary_html_and_plot(rossi):
    import matplotlib

    matplotlib.use("Agg")
    frame, site = rossi
    fed = fedstats.Federation.in_process(split(frame, site))
    result = fedstats.KaplanMeier("week", "arrest", group="fin", width=13, horizon=52).fit(fed)
    text = result.summary()
    assert "Federated Kaplan-Meier" in text and "Grid points:          4" in text
    assert "<table" in result._repr_html_()
    figure = result.plot()
    assert len(figure.axes[0].lines) == 2


# ------------------------------------------------------------------ odd site data
CELLS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.integers(-5, 400),
    st.sampled_from(["", "x", "12", None, True]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    times=st.lists(CELLS, min_size=12, max_size=40),
    events=st.lists(
        st.one_of(st.sampled_from([0, 1, 1.0, 2, -1, "1", None]), CELLS), min_size=12, max_size=40
    ),
)
def test_odd_site_frames_give_counts_or_typed_errors(times, events):
    """Whatever a site's columns hold, the reply is valid counts or a typed error naming it."""
    n = min(len(times), len(events))
    frame = pd.DataFrame({"t": pd.Series(times[:n], dtype=object),
                          "e": pd.Series(events[:n], dtype=object)})  # fmt: skip
    fed = fedstats.Federation.in_process({"odd": frame}, disclosure=OPEN)
    try:
        result = fedstats.KaplanMeier("t", "e", width=50, horizon=400).fit(fed)
    except fedstats.SiteDataError as error:
        assert "'odd'" in str(error)
        return
    table = result.event_table
    assert (table.to_numpy() >= 0).all()
    assert table[("all", "at_risk")].iloc[0] <= n


def deferred_frame(frame: pd.DataFrame, grid: np.ndarray, k: int) -> tuple[pd.DataFrame, int]:
    """What a deferring site releases, rebuilt row by row: (time on the grid, event) per
    patient, and the index of the site's last grid point."""
    point = np.minimum(np.searchsorted(grid, frame["t"], side="left"), len(grid) - 1)
    event = frame["e"].to_numpy(bool) & (frame["t"].to_numpy() <= grid[-1])
    release, pending = {}, []
    for j in range(len(grid)):
        pending += [i for i in np.flatnonzero(event & (point == j))]
        if len(pending) >= k:
            release.update(dict.fromkeys(pending, j))
            pending = []
    times, events = [], []
    for i in range(len(frame)):
        if event[i] and i in release:
            times.append(grid[release[i]])
            events.append(True)
        else:
            times.append(grid[point[i]])
            events.append(False)
    rows = pd.DataFrame({"t": times, "e": events})
    first_unreleased = min((point[i] for i in pending), default=len(grid))
    at_risk = [(rows["t"] >= g).sum() for g in grid]
    last = min(first_unreleased - 1, max(j for j in range(len(grid)) if at_risk[j] >= k))
    return rows, last


def test_deferred_sparse_events_equal_lifelines_on_the_released_data():
    rng = np.random.default_rng(21)
    frames = {}
    for site, n in (("a", 400), ("b", 250)):
        event_time = rng.exponential(60, n)
        censor = rng.uniform(10, 150, n)
        frames[site] = pd.DataFrame(
            {"t": np.minimum(event_time, censor), "e": event_time <= censor}
        )
    grid = np.arange(5.0, 151.0, 5.0)
    fed, replies = recording_federation(frames)
    k = fedstats.DisclosurePolicy().min_count
    deferred = fedstats.KaplanMeier("t", "e", grid=grid, sparse_events="defer").fit(fed)
    ended = fedstats.KaplanMeier("t", "e", grid=grid).fit(fedstats.Federation.in_process(frames))
    for _, reply in replies:
        counts = reply["result"]
        assert ((counts["events"] == 0) | (counts["events"] >= k)).all()
        assert ((counts["at_risk"] == 0) | (counts["at_risk"] >= k)).all()
    pieces, lasts = [], []
    for frame in frames.values():
        rows, last = deferred_frame(frame, grid, k)
        lasts.append(last)
        pieces.append(rows.assign(e=rows["e"] & (rows["t"] <= grid[last]),
                                  t=np.minimum(rows["t"], grid[last])))  # fmt: skip
    released = pd.concat(pieces, ignore_index=True)
    survival, _ = lifelines_curve(released["t"], released["e"], grid)
    reached = deferred.event_table[("all", "at_risk")].to_numpy() > 0
    # the curve over the sites reaching each time: lifelines on the released data
    partial = deferred.survival_reaching_sites_["all"].to_numpy()
    assert np.max(np.abs(partial[reached] - survival[reached])) < 1e-12
    # the pooled curve: released up to the earlier site's horizon only
    pooled = deferred.released_["all"].to_numpy()
    assert pooled.tolist() == [j <= min(lasts) for j in range(len(grid))]
    got = deferred.survival_function_["all"].to_numpy()
    assert np.max(np.abs(got[pooled] - survival[pooled])) < 1e-12
    assert np.isnan(got[~pooled]).all()
    assert pooled.sum() > ended.released_["all"].sum()  # a longer curve


def test_secure_aggregation_gives_the_same_curves_and_test(rossi):
    frame, site = rossi
    fed = fedstats.Federation.in_process(split(frame, site), disclosure=OPEN)
    grid = np.sort(frame["week"].unique()).astype(float)
    model = fedstats.KaplanMeier("week", "arrest", group="fin", grid=grid)
    clear = model.fit(fed)
    hidden = model.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    pd.testing.assert_frame_equal(hidden.event_table, clear.event_table, check_dtype=False)
    pd.testing.assert_frame_equal(hidden.survival_function_, clear.survival_function_)
    assert hidden.counts.n_obs == {"all sites": len(frame)} and hidden.counts.sites == 4
    assert any("secure aggregation" in note for note in hidden._notes())
    reference = multivariate_logrank_test(frame.week, frame.fin, frame.arrest)
    test = fedstats.logrank_test(
        fed, "week", "arrest", "fin", grid=grid, secure_aggregation=fedstats.SecureAggregation()
    )
    assert abs(test.statistic - reference.test_statistic) < 1e-8


def test_private_counts_by_secure_aggregation_carry_one_central_noise(tmp_path):
    import accounting

    frames = dp_sites(n_per_site=500)
    exact = fedstats.KaplanMeier("days", "died", width=100, horizon=1500).fit(
        fedstats.Federation.in_process(frames)
    )
    privacy = fedstats.RecordDP(noise_multiplier=3.0, delta=1e-6)
    deviations = []
    for run in range(40):
        (tmp_path / str(run)).mkdir()
        ledgers = ledgers_for(tmp_path / str(run), frames, epsilon=100.0)
        fed = fedstats.Federation.in_process(frames, ledgers=ledgers)
        private = fedstats.KaplanMeier(
            "days", "died", width=100, horizon=1500, privacy=privacy
        ).fit(fed, secure_aggregation=fedstats.SecureAggregation())
        deviations.append(private.counts.events[0] - exact.counts.events[0])
        scope = accounting.Scope(unit="patient", owner="a", study="study")
        entry = ledgers["a"].entries(scope)[-1]
        assert entry.parameters["site_noise_multiplier[events]"] == pytest.approx(
            3.0 / np.sqrt(3), rel=1e-6
        )
    deviations = np.array(deviations)
    # Deaths are clipped at 0 and capped by the numbers at risk; use the well-populated points.
    busy = exact.counts.events[0] > 30
    # Over the runs, each point's noise sd is sigma (the central level), not sigma * sqrt(3).
    assert deviations[:, busy].std(axis=0).mean() == pytest.approx(3.0, rel=0.15)
