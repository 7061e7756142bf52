"""Strata and frequency weights on survival counts: every crafted form is refused or gives
nothing a released cell does not.

The attacks, each written as the coordinator would send it (raw ``survival.counts``
requests through the codec, default disclosure policy, k = 10 and k_cell = 3):

* a strata column that singles out patients (an identifier, a one-patient flag), to read
  a stratum's event times;
* two strata (or group) columns differing on one patient, or a stratified request against
  an unstratified one, to difference a patient's event time out;
* weights that zero all but a few rows, or select a subset then the subset plus one
  patient, or give one patient a huge weight, or weigh one patient 2 and the rest 1;
* new request forms on another grid than the study's; weights under privacy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accounting
from fedstats.contract import codec
from fedstats.contract.tasks.survival import TASK
from fedstats.datasets import tcga_brca
from fedstats.site.protocol import Protocol
from fedstats.site.silo import Silo

GRID = [1500.0, 3000.0, 4500.0]
"""Coarse enough for region 0's deaths: 29 and 25 in the first two intervals."""


@pytest.fixture
def region() -> pd.DataFrame:
    """TCGA-BRCA region 0 (311 patients, 59 deaths), with columns a coordinator might name."""
    frame = tcga_brca().frames["region_0"][["time", "event", "race_white", "prior_malignancy_yes"]]
    frame = frame.reset_index(drop=True)
    rng = np.random.default_rng(0)
    return frame.assign(
        pid=np.arange(len(frame)),
        stage=rng.choice(["i", "ii"], len(frame)),
        w=rng.integers(1, 4, len(frame)),
        one=1,
    )


def ask(silo: Silo, grid=GRID, **args) -> dict:
    request = {"time": "time", "event": "event", "group": None, "grid": np.asarray(grid, float)}
    request.update(args)
    return codec.decode(silo.handle(codec.encode({"task": TASK, "args": request})))


def refused(reply: dict, rule: str | None = None, kind: str = "DisclosureError") -> bool:
    if reply["status"] != "error" or reply["error"]["type"] != kind:
        return False
    return rule is None or reply["error"]["values"]["rule"] == rule


# ------------------------------------------------------------------ strata


def test_an_identifier_as_stratum_is_refused(region):
    """Forty patients stratified by their own id: each stratum one patient."""
    small = region.iloc[:40].reset_index(drop=True)
    silo = Silo("s", small)
    reply = ask(silo, strata=["pid"], strata_levels=[list(range(40))])
    assert refused(reply, "cells")
    assert "strata" in reply["error"]["values"]["reason"]


def test_a_stratum_of_one_patient_is_refused(region):
    flagged = region.assign(flag=(region.pid == 17).astype(int))
    reply = ask(Silo("s", flagged), strata=["flag"], strata_levels=[[0, 1]], group="stage",
                levels=["i", "ii"])  # fmt: skip
    assert refused(reply, "cells")


def test_a_stratum_below_the_threshold_ends_every_curve_before_its_first_step(region):
    """Five patients (k_cell <= 5 < k): not refused as a cell, but no count of theirs can be
    released, so every stratum's and group's curve ends before the first grid point."""
    marked = region.assign(few=(region.pid < 5).astype(int))
    reply = ask(Silo("s", marked), strata=["few"], strata_levels=[[0, 1]])
    assert reply["status"] == "ok"
    assert not reply["result"]["at_risk"].any() and not reply["result"]["events"].any()


def test_two_strata_columns_differing_on_one_patient_are_refused_by_the_guard(region):
    """``stage`` then ``stage`` with one patient moved: the strata's row sets differ on one row,
    so the second request's counts minus the first's would give that patient's time."""
    moved = region.stage.copy()
    moved[3] = "ii" if moved[3] == "i" else "i"
    silo = Silo("s", region.assign(stage2=moved))
    first = ask(silo, strata=["stage"], strata_levels=[["i", "ii"]])
    assert first["status"] == "ok"
    second = ask(silo, strata=["stage2"], strata_levels=[["i", "ii"]])
    assert refused(second, "differencing")


def test_two_group_columns_differing_on_one_patient_are_refused_by_the_guard(region):
    moved = region.stage.copy()
    moved[8] = "ii" if moved[8] == "i" else "i"
    silo = Silo("s", region.assign(stage2=moved))
    assert ask(silo, group="stage", levels=["i", "ii"])["status"] == "ok"
    assert refused(ask(silo, group="stage2", levels=["i", "ii"]), "differencing")


def test_stratified_minus_unstratified_gives_no_cell_that_was_not_released(region):
    """The unstratified curve and a stratified one are both answered; the other strata's
    cells subtracted from the unstratified counts give, up to the stratified release's
    horizon, exactly the released cell, and after it nothing (every cell is cut there)."""
    silo = Silo("s", region)
    whole = ask(silo)["result"]
    split = ask(silo, strata=["stage"], strata_levels=[["i", "ii"]])["result"]
    reached = split["at_risk"].any(axis=0)
    assert reached[0] and not reached[1] and whole["events"][0, 1] > 0  # the strata stop earlier
    for name in ("at_risk", "events"):
        cells = split[name]
        assert np.array_equal(cells.sum(axis=0)[reached], whole[name][0][reached])
        assert not cells[:, ~reached].any()
        for cell in cells:
            assert ((cell == 0) | (cell >= 10)).all()


def test_new_request_forms_keep_the_study_grid(region):
    silo = Silo("s", region)
    assert ask(silo)["status"] == "ok"
    other = [100.0, 200.0, 300.0]
    assert refused(ask(silo, grid=other, strata=["stage"], strata_levels=[["i", "ii"]]), "grid")
    assert refused(ask(silo, grid=other, weights="w"), "grid")
    prefix = ask(silo, grid=GRID[:2], weights="w")  # a prefix of the study's grid
    assert prefix["status"] == "ok" and prefix["result"]["events"].any()


# ------------------------------------------------------------------ weights


def test_weights_that_keep_a_few_rows_are_refused(region):
    keep_two = region.assign(sel=(region.pid < 2).astype(int))
    assert refused(ask(Silo("s", keep_two), weights="sel"), "cells")


def test_weights_that_drop_one_row_are_refused(region):
    all_but_one = region.assign(sel=(region.pid != 5).astype(int))
    assert refused(ask(Silo("s", all_but_one), weights="sel"), "cells")


def test_a_subset_then_the_subset_plus_one_patient_is_refused_by_the_guard(region):
    first = (region.pid < 150).astype(int)
    second = ((region.pid < 150) | (region.pid == 200)).astype(int)
    silo = Silo("s", region.assign(sel=first, sel2=second))
    answered = ask(silo, weights="sel")
    assert answered["status"] == "ok" and answered["result"]["at_risk"][0, 0] == 150
    assert refused(ask(silo, weights="sel2"), "differencing")


def test_one_patient_with_a_huge_weight_is_refused(region):
    heavy = region.assign(hw=np.where(region.pid == 9, 10_000, 1))
    reply = ask(Silo("s", heavy), weights="hw")
    assert refused(reply, "cells")


def test_weights_of_one_but_on_one_patient_are_refused(region):
    """Weighted minus unweighted counts would be that patient's at-risk and event indicator."""
    nudged = region.assign(nw=np.where(region.pid == 9, 2, 1))
    silo = Silo("s", nudged)
    assert ask(silo)["status"] == "ok"
    assert refused(ask(silo, weights="nw"), "cells")


def test_weights_are_refused_under_privacy_before_any_charge(region, tmp_path):
    ledger = accounting.Ledger(tmp_path / "s.ledger")
    scope = accounting.Scope(unit="patient", owner="s", study="study")
    ledger.set_budget(scope, epsilon=10.0, delta=1e-6)
    silo = Silo("s", region, ledger=ledger)
    dp = {"noise_multipliers": {"events": 1.0}, "study": "study", "analysis": "a", "note": ""}
    reply = ask(silo, weights="w", dp=dp)
    assert refused(reply, kind="MalformedRequestError")
    assert "differential privacy" in reply["error"]["values"]["reason"]
    assert ledger.spent(scope).epsilon == 0.0


# ------------------------------------------------------------------ protocol


def test_the_protocol_fixes_strata_and_weights_of_a_kaplan_meier_analysis(region):
    protocol = Protocol.from_mapping(
        {
            "title": "TCGA survival",
            "analysis": [
                {"name": "curves", "model": "kaplan_meier", "outcome": "Surv(time, event)",
                 "groups": ["stage"], "time_grid": GRID},
                {"name": "stratified test", "model": "kaplan_meier",
                 "outcome": "Surv(time, event)", "groups": ["stage"], "strata": ["race_white"],
                 "weights": "w", "time_grid": GRID},
            ],
        }
    )  # fmt: skip
    silo = Silo("s", region, protocol=protocol)
    stratified = {"group": "stage", "levels": ["i", "ii"], "strata": ["race_white"],
                  "strata_levels": [[0, 1]]}  # fmt: skip
    assert ask(silo, group="stage", levels=["i", "ii"])["status"] == "ok"
    assert ask(silo, weights="w", **stratified)["status"] == "ok"
    assert refused(ask(silo, **stratified), kind="ProtocolError")  # unweighted: not approved
    other = {**stratified, "strata": ["prior_malignancy_yes"]}
    assert refused(ask(silo, weights="w", **other), kind="ProtocolError")
    assert refused(ask(silo, weights="one"), kind="ProtocolError")


# ------------------------------------------------------------------ hostile arguments


def test_a_reply_too_large_for_the_request_limits_is_refused_before_any_row(region):
    """Strata crossing into more cells than the limits allow: refused from the arguments."""
    wide = [list(range(50)), list(range(50))]
    reply = ask(Silo("s", region), strata=["pid", "stage"], strata_levels=wide)
    assert refused(reply, kind="MalformedRequestError")
    assert "cells" in reply["error"]["values"]["reason"]


names = st.one_of(
    st.none(), st.sampled_from(["stage", "w", "pid", "time", "nope", ""]), st.integers()
)
levels = st.one_of(
    st.none(),
    st.lists(
        st.one_of(st.sampled_from(["i", "ii", 0, 1, 1.0]), st.floats(), st.text(max_size=3)),
        max_size=4,
    ),
    st.just(["i", "i", "ii"]),
    st.integers(),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    strata=st.one_of(st.none(), st.lists(names, max_size=4), names),
    strata_levels=st.one_of(st.none(), st.lists(levels, max_size=4), levels),
    weights=names,
)
def test_hostile_strata_and_weights_get_a_typed_answer(region, strata, strata_levels, weights):
    """Whatever the coordinator puts in ``strata``, ``strata_levels`` and ``weights``, the
    site answers with counts or a typed refusal, never an internal error."""
    silo = Silo("s", region)
    args = {"strata": strata, "strata_levels": strata_levels, "weights": weights}
    reply = ask(silo, **args)
    grouped = ask(silo, group="stage", levels=strata_levels, weights=weights)
    if grouped["status"] == "error":
        assert grouped["error"]["type"] != "InternalSiteError", grouped
    if reply["status"] == "error":
        assert reply["error"]["type"] != "InternalSiteError", reply
    else:
        assert reply["result"]["at_risk"].shape[1] == len(GRID)
