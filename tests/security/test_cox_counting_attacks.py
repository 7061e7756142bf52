"""Attacks through ``Surv(start, stop, event)`` and frequency weights in Cox fits, refused.

(a) Several rows per patient: a rule that counts rows counts one patient ``k``
    times. With the frame indexed by patient, every rule counts patients.
(b) A crafted start column: any numeric column earlier than the stop can be
    named as the start, leaving one or two patients at risk at an event time,
    so that time's score term describes them alone.
(c) Differencing: two requests whose start columns differ, or whose delayed
    entries cover a few patients, differ only in those patients' terms.
(d) Weights singling out rows: a 0/1 weight column, or one row dwarfing the others.

Each attack is made against a site with the default policy (refused, with the
rule named) and, where it shows what the rule protects, against a permissive
one (answered).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.contract import codec
from fedstats.contract.design import DesignSpec
from fedstats.errors import ConvergenceWarning, DisclosureError, ProtocolError
from fedstats.site.protocol import Protocol
from fedstats.site.silo import Silo

DEFAULT = fedstats.DisclosurePolicy()
K = DEFAULT.k_cell


def patients(n: int = 60, seed: int = 0) -> pd.DataFrame:
    """``n`` patients with three intervals each, ``(0, 1], (1, 2], (2, T]``; events only before
    time 7 and a third of the patients followed to 10, so every risk set is large."""
    rng = np.random.default_rng(seed)
    end = np.round(rng.uniform(3, 10, n), 2)
    end[: n // 3] = 10.0
    event = (end < 7).astype(int)
    rows = []
    for pid in range(n):
        x = round(float(rng.normal()), 3)
        for start, stop, last in ((0.0, 1.0, False), (1.0, 2.0, False), (2.0, end[pid], True)):
            lab = round(float(rng.normal()), 3)
            rows.append((f"p{pid}", start, stop, int(last and event[pid]), x, lab))
    frame = pd.DataFrame(rows, columns=["patient", "start", "stop", "event", "x", "lab"])
    return frame.set_index("patient")


def fed(frame: pd.DataFrame, policy=DEFAULT) -> fedstats.Federation:
    return fedstats.Federation.in_process({"s": frame}, disclosure=policy)


def refused(rule: str, fit) -> DisclosureError:
    with pytest.raises(DisclosureError) as info:
        fit()
    assert info.value.site == "s" and info.value.rule == rule, info.value
    return info.value


# ------------------------------------------------------------------------- (a) rows vs patients
def test_an_indicator_on_every_row_of_one_patient_is_refused():
    """``flag`` is 1 on the three rows of one patient: three rows pass the row rule, one patient
    does not. Indexed by row instead, each row counts as a patient and the fit is answered."""
    frame = patients().assign(flag=0)
    frame.loc["p7", "flag"] = 1
    formula = "Surv(start, stop, event) ~ x + flag"
    error = refused("cells", lambda: fedstats.CoxPH(formula).fit(fed(frame)))
    assert "patients" in error.reason
    with warnings.catch_warnings():  # one patient's flag may separate: no finite estimate
        warnings.simplefilter("ignore", ConvergenceWarning)
        fedstats.CoxPH(formula).fit(fed(frame.reset_index(drop=True)))


def test_a_time_varying_column_dominated_by_one_patient_is_refused():
    """``lab`` differs from its mode only on the rows of two patients (six rows)."""
    frame = patients().assign(lab=0.0)
    frame.loc[["p3", "p4"], "lab"] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    error = refused(
        "cells", lambda: fedstats.CoxPH("Surv(start, stop, event) ~ x + lab").fit(fed(frame))
    )
    assert "'lab'" in error.reason and "patients" in error.reason


def test_a_design_of_few_patients_with_many_rows_is_below_the_threshold():
    """Four patients with five rows each are 20 rows, over a threshold of 10, but 4 patients."""
    rows = [
        (f"p{p}", float(j), j + 1.0, int(j == 4 and p < 2), float(p), float(j))
        for p in range(4)
        for j in range(5)
    ]
    frame = pd.DataFrame(rows, columns=["patient", "start", "stop", "event", "x", "lab"])
    policy = fedstats.DisclosurePolicy(k_cell=2)
    refused(
        "threshold",
        lambda: fedstats.CoxPH("Surv(start, stop, event) ~ x").fit(
            fed(frame.set_index("patient"), policy)
        ),
    )


# ------------------------------------------------------------------------- (b) crafted start
def summaries(silo: Silo, outcome: str) -> dict:
    """One ``cox.summaries`` request at ``beta = 0`` for ``outcome ~ x``."""
    spec = DesignSpec(
        formula=f"{outcome} ~ x", outcome=outcome, variables=tuple(sorted(
            {"x", "stop", "event", outcome[5:].split(",")[0]})), levels={}, columns=("x",),
        site_intercepts=False, sites=("s",), outcome_kind="survival",
    )  # fmt: skip
    args = {"design": spec.to_wire(), "beta": np.zeros(1), "ties": "breslow"}
    return codec.decode(silo.handle(codec.encode({"task": "cox.summaries", "args": args})))


def test_a_start_column_that_leaves_few_patients_at_risk_is_refused():
    """``crafted`` sits just before each row's stop, so each event's risk set is itself: the
    default policy refuses, and so does the most permissive one (``min_count = 1`` keeps
    ``k_cell = 2``; ``k_cell = 1``, which answered, is refused as a setting)."""
    frame = patients().assign(crafted=lambda f: f["stop"] - 0.001)
    reply = summaries(Silo("s", frame), "Surv(crafted, stop, event)")
    assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "cells"
    assert "fewer than 3 patients are at risk" in reply["error"]["values"]["reason"]
    permissive = Silo("s", frame, policy=fedstats.DisclosurePolicy(min_count=1))
    reply = summaries(permissive, "Surv(crafted, stop, event)")
    assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "cells"
    assert "fewer than 2 patients are at risk" in reply["error"]["values"]["reason"]
    assert summaries(Silo("s", frame), "Surv(start, stop, event)")["status"] == "ok"


# ------------------------------------------------------------------------- (c) differencing
def test_a_second_start_column_for_the_same_outcome_is_refused():
    """Fits with start columns that differ on a few rows differ only in those rows' terms."""
    frame = patients()
    frame["start2"] = frame["start"]
    frame.loc[frame.index == "p5", "start2"] = [0.0, 1.5, 2.0]  # p5 joins its 2nd interval late
    federation = fed(frame)
    fedstats.CoxPH("Surv(start, stop, event) ~ x").fit(federation)
    error = refused(
        "entry", lambda: fedstats.CoxPH("Surv(start2, stop, event) ~ x").fit(federation)
    )
    assert "'start'" in error.reason and "'start2'" in error.reason


def test_delayed_entry_of_a_few_patients_is_refused():
    """Only two patients enter late: the fit against the same outcome without their delay
    isolates them. The late entries are a row set of fewer than k patients."""
    frame = patients().reset_index(drop=True).iloc[2::3].copy()  # one row per patient
    frame["start"] = 0.0
    frame.iloc[:2, frame.columns.get_loc("start")] = 0.5
    refused(
        "differencing",
        lambda: fedstats.CoxPH("Surv(start, stop, event) ~ x").fit(fed(frame)),
    )


def test_a_pooled_grid_ends_before_a_point_where_few_patients_enter():
    """On the pooled model's grid, the change of a risk-set sum between two points holds the
    leavers and the entrants: with two patients entering in (4, 6], the curve ends at 4 (they
    would join at 6); ten entering in (0, 2] are enough (the grid's threshold is min_count)."""
    frame = patients(n=300).reset_index(drop=True).iloc[2::3].copy()
    frame["start"] = 0.0
    frame.iloc[:10, frame.columns.get_loc("start")] = 1.5  # ten (min_count) enter in (0, 2]
    frame.iloc[10:12, frame.columns.get_loc("start")] = 4.5  # two enter in (4, 6]
    frame.iloc[:12, frame.columns.get_loc("stop")] = 10.0
    result = fedstats.CoxPH(
        "Surv(start, stop, event) ~ x", strata=None, grid=[2.0, 4.0, 6.0, 8.0, 10.0]
    ).fit(fedstats.Federation.in_process({"s": frame}))
    baseline = result.baseline_cumulative_hazard_["cumulative_hazard"]
    assert baseline.loc[[2.0, 4.0, 6.0]].notna().all() and baseline.loc[[8.0, 10.0]].isna().all()


# ------------------------------------------------------------------------- (d) weights
def test_weights_that_select_or_dominate_rows_are_refused():
    frame = patients().assign(one=0.0, big=1.0)
    frame.iloc[:2, frame.columns.get_loc("one")] = 1.0  # selects two rows
    frame.iloc[0, frame.columns.get_loc("big")] = 1e6  # one row dwarfs the rest
    for column in ("one", "big"):
        error = refused(
            "cells",
            lambda column=column: fedstats.CoxPH(
                "Surv(start, stop, event) ~ x", weights=column
            ).fit(fed(frame)),
        )
        assert column in error.reason


def test_a_private_request_for_the_counting_form_is_refused_at_the_site():
    """A coordinator that skips the model's checks meets the site's own: the private Cox
    release clips one row as one patient."""
    frame = patients()
    fit = fedstats.CoxPH("Surv(start, stop, event) ~ x").fit(
        fed(frame, fedstats.DisclosurePolicy(min_count=1))
    )
    args = {
        "design": fit.design,
        "beta": np.zeros(3),
        "grid": np.array([5.0, 10.0]),
        "dp": {"noise_multipliers": {"gradient": 1.0}},
    }
    reply = codec.decode(
        Silo("s", frame).handle(codec.encode({"task": "cox.piecewise_summaries", "args": args}))
    )
    assert reply["status"] == "error" and reply["error"]["type"] == "MalformedRequestError"
    assert "several rows" in reply["error"]["values"]["reason"]


# ------------------------------------------------------------------------- approved protocol
COUNTING_PROTOCOL = """
[protocol]
title = "time-varying exposure"

[[protocol.analysis]]
name = "exposure"
model = "cox"
formula = "Surv(start, stop, event) ~ x"
weights = "n"
time_grid = [2.0, 4.0, 6.0, 8.0, 10.0]
"""


def test_a_protocol_approves_one_counting_outcome_its_weights_and_its_grid():
    """The approved analysis is answered (stratified, and pooled on its grid); another start
    column, no weights, or another grid is refused before any row is read."""
    frame = patients(n=300).assign(n=1.0)
    frame["start2"] = frame["start"]
    approved = Protocol.from_toml(COUNTING_PROTOCOL)
    assert approved.survival_grid("stop", "event") is not None
    federation = fedstats.Federation.in_process({"s": frame}, protocols={"s": approved})
    formula = "Surv(start, stop, event) ~ x"
    fedstats.CoxPH(formula, weights="n").fit(federation)
    fedstats.CoxPH(formula, weights="n", strata=None, grid=[2.0, 4.0, 6.0, 8.0, 10.0]).fit(
        federation
    )
    for model in (
        fedstats.CoxPH("Surv(start2, stop, event) ~ x", weights="n"),
        fedstats.CoxPH(formula),
    ):
        with pytest.raises(ProtocolError):
            model.fit(federation)
    with pytest.raises(DisclosureError) as info:
        fedstats.CoxPH(formula, weights="n", strata=None, grid=[3.0, 6.0]).fit(federation)
    assert info.value.rule == "grid"


def test_the_guard_over_patients_remembers_across_restarts(tmp_path):
    """A population one patient (three rows) smaller, asked after the site restarted: three
    rows pass the guard over rows, and the guard over patients, kept in the site's record,
    still refuses it."""
    frame = patients()
    frame["z"] = 1.0
    frame.loc["p5", "z"] = np.nan  # one patient's three intervals
    path = tmp_path / "guard.sqlite"
    formula = "Surv(start, stop, event) ~ x"
    first = Silo("s", frame, guard_path=path)
    fedstats.CoxPH(formula).fit(fedstats.Federation({"s": first.handle}))
    first._context.guard.close()
    again = Silo("s", frame, guard_path=path)
    with pytest.raises(DisclosureError) as info:
        fedstats.CoxPH(f"{formula} + z", missing="drop").fit(
            fedstats.Federation({"s": again.handle})
        )
    assert info.value.rule == "differencing" and "patients" in info.value.reason
