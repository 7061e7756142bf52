"""Event times never leak: survival grids fixed by the study, unsafe requests refused whole.

The attack: Kaplan–Meier requests over grids chosen per request (``[g, very
large]`` for every ``g``) recovered 49 of 59 death times of a TCGA region to
the day; a withheld small group followed from the other groups' counts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.contract.tasks.survival import TASK
from fedstats.datasets import tcga_brca
from fedstats.errors import DisclosureError
from fedstats.site.silo import Silo


@pytest.fixture(scope="module")
def region_0() -> pd.DataFrame:
    """TCGA-BRCA region 0: 311 patients, 59 deaths."""
    return tcga_brca().frames["region_0"]


def counts(silo: Silo, grid, group=None, levels=None, dp=None) -> dict:
    args = {"grid": np.asarray(grid, float), "time": "time", "event": "event", "group": group}
    if group is not None:
        args["levels"] = levels
    if dp is not None:
        args["dp"] = dp
    return codec.decode(silo.handle(codec.encode({"task": TASK, "args": args})))


def test_a_grid_sweep_recovers_no_death_time(region_0):
    """The sweep of the issue, request by request: only the first grid is ever answered, and
    every other grid is refused by the grid rule, so no death time is learnt more finely than
    the study grid."""
    silo = Silo("region_0", region_0)
    deaths = np.sort(region_0.time[region_0.event == 1].unique())
    end = float(region_0.time.max()) + 1
    replies = [counts(silo, [g, end]) for g in deaths]
    refused = [r for r in replies[1:] if r["status"] == "error"]
    assert len(refused) == len(deaths) - 1
    assert {r["error"]["values"]["rule"] for r in refused} == {"grid"}
    # what the attack would read: deaths up to g, for each answered g
    answered = [(g, r) for g, r in zip(deaths, replies, strict=True) if r["status"] == "ok"]
    assert len(answered) <= 1


def test_the_study_grid_and_its_prefixes_are_answered_and_equal_coarsened_counts(region_0):
    """Oracle: the counts computed with pandas on times coarsened up to the grid."""
    silo = Silo("region_0", region_0)
    grid = np.array([1000.0, 2000.0, 3000.0])
    full = counts(silo, grid)
    prefix = counts(silo, grid[:2])
    assert full["status"] == "ok" and prefix["status"] == "ok"
    point = np.searchsorted(grid, region_0.time.to_numpy(), side="left")
    at_risk = [(point >= j).sum() for j in range(len(grid))]
    np.testing.assert_array_equal(full["result"]["at_risk"][0], at_risk)
    np.testing.assert_array_equal(prefix["result"]["at_risk"][0], at_risk[:2])
    np.testing.assert_array_equal(prefix["result"]["events"][0], full["result"]["events"][0][:2])
    other = counts(silo, [1000.0, 2100.0, 3000.0])
    assert other["error"]["values"]["rule"] == "grid"


def test_a_small_group_cannot_be_derived_from_the_other_groups(region_0):
    """A group of 4 patients ends every group's curve before the first grid point; the
    ungrouped curve minus the large group then gives nothing about the small one."""
    data = region_0.assign(arm=np.where(np.arange(len(region_0)) < 4, "tiny", "rest"))
    silo = Silo("region_0", data)
    grid = [1000.0, 2000.0, 3000.0]
    grouped = counts(silo, grid, group="arm", levels=["rest", "tiny"])["result"]
    ungrouped = counts(silo, grid)["result"]
    assert not grouped["at_risk"].any() and not grouped["events"].any()
    assert ungrouped["at_risk"][0][0] == len(data)
    assert counts(silo, grid, group="arm", levels=["rest"])["error"]["type"] == "UnknownLevelError"


def test_groups_end_together_where_the_first_must_end(region_0):
    """Oracle: each arm's own safe horizon, from ungrouped requests on each arm's rows."""
    data = region_0.assign(arm=np.where(np.arange(len(region_0)) % 2 == 0, "a", "b"))
    grid = np.array([2000.0, 4000.0])  # arm b's second interval holds 1 to 9 deaths
    grouped = counts(Silo("s", data), grid, group="arm", levels=["a", "b"])["result"]
    ends = []
    for arm in ("a", "b"):
        alone = counts(Silo("s", data[data.arm == arm].reset_index(drop=True)), grid)["result"]
        ends.append(int(np.flatnonzero(alone["at_risk"][0])[-1]))
    assert ends == [1, 0]  # alone, arm a would be released at 4,000 days too
    released = np.flatnonzero(grouped["at_risk"].any(axis=0))
    assert int(released[-1]) == min(ends) == 0


def test_a_level_absent_at_a_site_is_no_reason_to_refuse(region_0):
    data = region_0.assign(arm="a")
    silo = Silo("region_0", data)
    assert counts(silo, [1000.0, 2000.0], group="arm", levels=["a", "b"])["status"] == "ok"


def test_private_requests_may_use_any_grid_and_are_charged(region_0, tmp_path):
    ledger = accounting.Ledger(tmp_path / "site.db")
    scope = accounting.Scope(unit="patient", owner="region_0", study="st")
    ledger.set_budget(scope, epsilon=10.0, delta=1e-5)
    silo = Silo("region_0", region_0, ledger=ledger)
    assert counts(silo, [1000.0, 2000.0])["status"] == "ok"
    dp = {"noise_multipliers": {"events": 5.0}, "study": "st", "analysis": "a", "note": ""}
    for grid in ([100.0, 5000.0], [200.0, 5000.0]):
        assert counts(silo, grid, dp=dp)["status"] == "ok"
    assert ledger.spent(scope, pld=False).epsilon > 0
    assert len(ledger.entries(scope)) == 2


def test_the_study_grid_survives_a_restart(region_0, tmp_path):
    path = tmp_path / "guard.sqlite"
    first = Silo("region_0", region_0, guard_path=path)
    assert counts(first, [1000.0, 2000.0])["status"] == "ok"
    first._context.guard.close()
    again = Silo("region_0", region_0, guard_path=path)
    assert counts(again, [900.0, 2000.0])["error"]["values"]["rule"] == "grid"


def test_the_public_api_names_the_site_and_the_rule(region_0):
    fed = fedstats.Federation.in_process({"region_0": region_0})
    fedstats.KaplanMeier("time", "event", grid=[1000.0, 2000.0]).fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.KaplanMeier("time", "event", grid=[900.0, 2000.0]).fit(fed)
    assert info.value.site == "region_0" and info.value.rule == "grid"
    assert info.value.task == TASK


def test_pooled_cox_grid_sums_take_the_study_grid_only(region_0):
    fed = fedstats.Federation.in_process({"region_0": region_0})
    formula = "Surv(time, event) ~ age_at_index"
    fedstats.CoxPH(formula, strata=None, grid=[1000.0, 2000.0, 3000.0]).fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.CoxPH(formula, strata=None, grid=[1000.0, 2100.0, 3000.0]).fit(fed)
    assert info.value.rule == "grid" and info.value.task == "cox.grid_summaries"


def deferred(silo: Silo, grid, group=None) -> dict:
    args = {"grid": np.asarray(grid, float), "time": "time", "event": "event", "group": group}
    if group is not None:
        args["levels"] = [0, 1]
    args["sparse_events"] = "defer"
    return codec.decode(silo.handle(codec.encode({"task": TASK, "args": args})))


def test_grouped_deferred_curves_minus_the_ungrouped_one_reveal_no_group_cell(region_0):
    """Deferred deaths are released on one schedule for all groups, the ungrouped curve's:
    per-group schedules (the oracle below, computed the old way) let the ungrouped curve minus
    the groups give back a group's deaths at a point where that group released none."""
    from fedstats.site.handlers.survival import grid_counts

    k = 10
    grid = np.arange(365.0, 3651.0, 365.0)
    group = "ajcc_pathologic_n_n0_i"
    silo = Silo("region_0", region_0)
    alone = deferred(silo, grid)["result"]
    grouped = deferred(silo, grid, group)["result"]
    events = np.asarray(grouped["events"])
    released = events.sum(axis=0) > 0
    assert released.any()  # the check below is not vacuous
    np.testing.assert_array_equal(np.asarray(alone["events"])[0][released], events.sum(0)[released])
    assert set(np.unique(events)) <= {0.0} | set(range(k, 10**6))
    # the oracle: with a schedule per group, differencing gives a cell of 1 to k - 1 deaths
    time, event = region_0.time.to_numpy(float), region_0.event.to_numpy().astype(bool)
    old = grid_counts(time, event, region_0[group].to_numpy().astype(int), 2, grid, k, defer=True)
    difference = np.asarray(alone["events"])[0] - old[1].sum(axis=0)
    assert any(0 < d < k for d, seen in zip(difference, old[1].sum(0) > 0, strict=True) if seen)


def test_the_count_censored_early_is_never_a_small_cell():
    """Patients still followed after the safe horizon: 1 to k - 1 leave the site as k."""
    frame = pd.DataFrame({"time": np.arange(1, 31, dtype=float), "event": [1] * 10 + [0] * 20})
    silo = Silo("small", frame)  # k = 10: at 30, 5 remain; the curve ends at 25
    reply = counts(silo, [10.0, 20.0, 25.0, 30.0])["result"]
    assert reply["at_risk"][0].tolist() == [30, 20, 10, 0]
    assert reply["truncated"] == 10  # 5 patients, released as "at most 10"
