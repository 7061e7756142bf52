"""Cross-cells: a one-patient cell of the outcome crossed with a design column, refused.

Every design column and the outcome can hold 0 or at least ``k`` rows while
the cell "exposed and diseased" holds one patient: the first round's ``X'y``
entry of ``exposed`` is that count, and a site's own fit (``heterogeneity()``'s
per-site estimate and standard error) gives back its whole 2x2 table. The
attacks here, each through the public API and through raw requests to
:meth:`fedstats.site.silo.Silo.handle` with the default policy (``k_cell`` = 3):

* the 2x2 table of a binary column, read from a site's estimate and standard
  error (the Woolf formulas invert exactly) and from the score at ``beta = 0``;
* a level of a categorical term, the reference level included (its cell is the
  outcome total minus the other levels' cells);
* a stratum with one event in a stratified Cox fit;
* a cell of one patient spread over several rows, on a frame indexed by patient;
* any 2x2 table (hypothesis): no answered first-round reply decodes to a cell
  of 1 to ``k - 1`` patients.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.contract import codec
from fedstats.errors import DisclosureError
from fedstats.models import fairness
from fedstats.models.agree import agree_design
from fedstats.site.silo import Silo

DEFAULT = fedstats.DisclosurePolicy()
K = DEFAULT.k_cell


def two_by_two(n11: int, n10: int, n01: int, n00: int, seed: int = 0) -> pd.DataFrame:
    """A frame holding ``n11`` exposed diseased, ``n10`` exposed healthy, ``n01`` unexposed
    diseased and ``n00`` unexposed healthy patients, shuffled, with an ordinary covariate."""
    exposed = [1] * (n11 + n10) + [0] * (n01 + n00)
    disease = [1] * n11 + [0] * n10 + [1] * n01 + [0] * n00
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(exposed))
    frame = pd.DataFrame({"exposed": exposed, "disease": disease}).iloc[order]
    return frame.reset_index(drop=True).assign(age=rng.normal(55, 9, len(exposed)).round(1))


def woolf_table(b0: float, b1: float, se0: float, se1: float) -> tuple[float, float]:
    """The attacker's decoder: the exposed cells ``(n11, n10)`` from a site's logistic fit of
    ``disease ~ exposed`` (``exp(b0) = n01/n00``, ``se0^2 = 1/n01 + 1/n00``,
    ``exp(b0 + b1) = n11/n10``, ``se1^2 - se0^2 = 1/n11 + 1/n10``)."""
    odds = np.exp(b0 + b1)
    n11 = (1 + odds) / (se1**2 - se0**2)
    return n11, n11 / odds


def refusal(fit) -> DisclosureError:
    with pytest.raises(DisclosureError) as info:
        fit()
    return info.value


def assert_cross_cells(error: DisclosureError, site: str, named: str) -> None:
    """The refusal names the rule, the site and the column or level, never a count."""
    assert error.rule == "cross-cells" and error.site == site, error
    assert named in error.reason
    assert not any(ch.isdigit() for ch in error.reason.replace(named, "").replace(str(K), ""))


# ------------------------------------------------------------------ the 2x2 table


def test_heterogeneity_does_not_give_back_a_one_patient_cell():
    """The issue's attack: site ``a``'s own fit would decode to its table with a cell of 1.
    Site ``b`` (every cell at least ``k``) shows the decoder works; ``a`` is left out."""
    frames = {"a": two_by_two(1, 29, 39, 31, seed=1), "b": two_by_two(20, 25, 18, 30, seed=2)}
    frames["c"] = two_by_two(15, 22, 19, 27, seed=3)
    fed = fedstats.Federation.in_process(frames)
    result = fedstats.heterogeneity(fedstats.LogisticRegression("disease ~ exposed"), fed)
    est, se = result.estimates, result.std_errors
    n11, n10 = woolf_table(
        est.loc["b", "Intercept"], est.loc["b", "exposed"],
        se.loc["b", "Intercept"], se.loc["b", "exposed"],
    )  # fmt: skip
    assert (n11, n10) == (pytest.approx(20, abs=1e-6), pytest.approx(25, abs=1e-6))
    assert "a" not in est.index
    assert "crossed with the design column 'exposed' has a cell" in result.excluded["a"]


def test_a_pooled_fit_over_a_one_patient_cell_is_refused():
    fed = fedstats.Federation.in_process({"a": two_by_two(1, 29, 39, 31)})
    error = refusal(lambda: fedstats.LogisticRegression("disease ~ exposed + age").fit(fed))
    assert_cross_cells(error, "a", "exposed")
    error = refusal(lambda: fedstats.GLM("disease ~ exposed", family="binomial").fit(fed))
    assert_cross_cells(error, "a", "exposed")


def test_a_raw_first_round_does_not_give_the_cell():
    """``gradient[exposed]`` at ``beta = 0`` is ``n11 - n1 / 2`` and ``hessian`` gives ``n1``:
    the coordinator sends the design agreed with an honest site to the attacked one."""
    spec = agree_design(
        fedstats.Federation.in_process({"a": two_by_two(10, 20, 30, 40)}),
        "disease ~ I(age > 60) + exposed", analysis="probe",
    ).spec  # fmt: skip
    silo = Silo("a", two_by_two(1, 29, 39, 31))
    reply = ask(silo, spec.to_wire(), spec.n_params)
    assert reply["status"] == "error" and reply["error"]["type"] == "DisclosureError"
    assert reply["error"]["values"]["rule"] == "cross-cells"
    assert "exposed" in reply["error"]["values"]["reason"]


def test_a_computed_indicator_is_a_two_valued_column_too():
    """``I(age > c)`` chosen so that its cell with the outcome holds one patient."""
    frame = two_by_two(10, 20, 30, 40, seed=4)
    healthy = frame.index[frame.disease == 0]
    frame.loc[frame.disease == 1, "age"] = np.linspace(40, 59, 40)
    frame.loc[frame.index[frame.disease == 1][0], "age"] = 77.0
    frame.loc[healthy[:12], "age"] = np.linspace(65, 80, 12)
    frame.loc[healthy[12:], "age"] = np.linspace(35, 59, len(healthy) - 12)
    cut = 62
    assert (frame.age > cut).sum() >= K and (frame.age <= cut).sum() >= K  # the column passes
    fed = fedstats.Federation.in_process({"a": frame})
    error = refusal(lambda: fedstats.LogisticRegression(f"disease ~ I(age > {cut})").fit(fed))
    assert error.rule == "cross-cells" and f"age > {cut}" in error.reason


def ask(silo: Silo, design: dict, p: int) -> dict:
    request = {"design": design, "beta": np.zeros(p)}
    return codec.decode(silo.handle(codec.encode({"task": "logistic.summaries", "args": request})))


# ------------------------------------------------------------------ levels and strata


@pytest.mark.parametrize("level", ["a", "b"])
def test_a_level_of_a_categorical_term_is_refused(level):
    """Level ``b`` is a design column; ``a`` (the reference) is not, but its cell is the
    outcome total minus the others'. Either holding one diseased patient is refused."""
    rng = np.random.default_rng(5)
    arm = np.repeat(["a", "b", "c"], 30)
    disease = rng.permutation(np.r_[np.ones(45), np.zeros(45)])[:90]
    disease[arm == level] = 0
    disease[np.flatnonzero(arm == level)[0]] = 1
    frame = pd.DataFrame({"arm": arm, "disease": disease.astype(int)})
    fed = fedstats.Federation.in_process({"s": frame})
    error = refusal(lambda: fedstats.LogisticRegression("disease ~ C(arm)").fit(fed))
    assert error.rule == "cross-cells" and error.site == "s"
    named = f"level {level!r} of 'arm'" if level == "a" else "'C(arm)[T.b]'"
    assert named in error.reason


def test_a_stratum_with_one_event_is_refused():
    """A stratified Cox fit's score sums per stratum: a stratum of 20 patients with one event
    gives that patient's covariates against the stratum's weighted mean."""
    rng = np.random.default_rng(6)
    n = 80
    centre = np.repeat(["x", "y"], n // 2)
    event = (rng.random(n) < 0.5).astype(int)
    event[centre == "x"] = 0
    event[0] = 1
    frame = pd.DataFrame(
        {"time": rng.uniform(1, 10, n).round(2), "event": event, "age": rng.normal(60, 8, n),
         "centre": centre}
    )  # fmt: skip
    fed = fedstats.Federation.in_process({"s": frame})
    error = refusal(lambda: fedstats.CoxPH("Surv(time, event) ~ age", strata=["centre"]).fit(fed))
    assert error.rule == "cross-cells" and "stratum" in error.reason
    frame.loc[1:3, "event"] = 1  # the stratum's cell now holds k patients: answered
    fedstats.CoxPH("Surv(time, event) ~ age", strata=["centre"]).fit(
        fedstats.Federation.in_process({"s": frame})
    )


def test_a_cell_of_one_patient_on_several_rows_is_refused():
    """The frame is indexed by patient; one exposed patient has three diseased rows (``k``
    rows, one patient). Indexed by row instead, the three rows count as three patients."""
    base = two_by_two(0, 30, 40, 30, seed=7)
    one = pd.DataFrame({"exposed": [1] * 3, "disease": [1] * 3, "age": [50.0] * 3})
    frame = pd.concat([base, one], ignore_index=True)
    frame.index = [f"p{i}" for i in range(len(base))] + ["q"] * 3
    fed = fedstats.Federation.in_process({"s": frame})
    error = refusal(lambda: fedstats.LogisticRegression("disease ~ exposed").fit(fed))
    assert error.rule == "cross-cells" and "rows count once" in error.reason
    by_row = fedstats.Federation.in_process({"s": frame.reset_index(drop=True)})
    fedstats.LogisticRegression("disease ~ exposed").fit(by_row)


# ------------------------------------------------------------------ any table


PROBE = agree_design(
    fedstats.Federation.in_process({"s": two_by_two(10, 20, 30, 40)}),
    "disease ~ exposed",
    analysis="probe",
).spec


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells=st.tuples(*[st.integers(0, 14)] * 4), seed=st.integers(0, 2**16))
def test_no_answered_first_round_decodes_to_a_small_cell(cells, seed):
    """Whatever the table, an answered ``logistic.summaries`` at ``beta = 0`` decodes (the
    attacker's arithmetic on ``gradient`` and ``hessian``) to cells of 0 or at least ``k``."""
    reply = ask(Silo("s", two_by_two(*cells, seed=seed)), PROBE.to_wire(), PROBE.n_params)
    if reply["status"] != "ok":  # refused (a small cell, too few patients, no events)
        return
    gradient, hessian = reply["result"]["gradient"], reply["result"]["hessian"]
    n, n1 = 4 * hessian[0, 0], 4 * hessian[1, 1]
    cases, n11 = gradient[0] + n / 2, gradient[1] + n1 / 2
    decoded = np.array([n11, n1 - n11, cases - n11, n - n1 - cases + n11])
    assert np.allclose(decoded, cells)  # the decoder is right ...
    assert not ((decoded > 0.5) & (decoded < K - 0.5)).any()  # ... and finds no small cell


def test_an_ordinary_table_is_answered():
    """Control: every cell at least ``k`` — answered, and the decoder reads it."""
    reply = ask(Silo("s", two_by_two(K, K, 7, 9)), PROBE.to_wire(), PROBE.n_params)
    assert reply["status"] == "ok"
    assert reply["result"]["gradient"][1] + 2 * reply["result"]["hessian"][1, 1] == K


# ------------------------------------------------------------------ every exact model


def competing_frame(seed: int = 9) -> pd.DataFrame:
    """120 patients, 30 exposed; of the exposed, one failed from cause 1, 15 from cause 2 and
    14 were censored (times on (0, 10], every cause common in both halves of follow-up)."""
    rng = np.random.default_rng(seed)
    status = np.r_[[1] + [2] * 15 + [0] * 14, rng.permutation([1] * 35 + [2] * 25 + [0] * 30)]
    return pd.DataFrame(
        {
            "t": rng.uniform(0.5, 10, 120).round(2),
            "status": status,
            "event": (status > 0).astype(int),
            "disease": (status == 1).astype(int),
            "exposed": np.r_[np.ones(30, int), np.zeros(90, int)],
            "x": rng.normal(size=120).round(3),
            "sex": rng.integers(0, 2, 120),
        }
    )


EXACT_MODELS = {
    "logistic": lambda fed: fedstats.LogisticRegression("disease ~ exposed + x").fit(fed),
    "glm binomial": lambda fed: fedstats.GLM("disease ~ exposed + x", "binomial").fit(fed),
    "fairness": lambda fed: fairness.fit_penalized(
        fedstats.LogisticRegression("disease ~ exposed + x"), fed, groups="sex", gamma=1.0
    ),
    "fine-gray": lambda fed: fedstats.FineGray(
        "Surv(t, status) ~ exposed + x", cause=1, grid=[5.0, 10.0]
    ).fit(fed),
}


@pytest.mark.parametrize("model", sorted(EXACT_MODELS))
def test_every_exact_model_refuses_the_one_patient_cell(model):
    """One exposed patient has the outcome (cause 1): every exact model over ``exposed`` and
    that outcome is refused by the same rule, naming the column."""
    fed = fedstats.Federation.in_process({"s": competing_frame()})
    error = refusal(lambda: EXACT_MODELS[model](fed))
    assert_cross_cells(error, "s", "exposed")


def test_the_competing_cause_is_answered_where_its_cells_are_large():
    """Control for the Fine-Gray case: cause 2 crossed with ``exposed`` has cells of 15."""
    fed = fedstats.Federation.in_process({"s": competing_frame()})
    fedstats.FineGray("Surv(t, status) ~ exposed + x", cause=2, grid=[5.0, 10.0]).fit(fed)


def test_a_cox_fit_refuses_the_one_patient_cell_of_the_event():
    frame = competing_frame().assign(event=lambda f: (f.status == 1).astype(int))
    fed = fedstats.Federation.in_process({"s": frame})
    error = refusal(lambda: fedstats.CoxPH("Surv(t, event) ~ exposed + x").fit(fed))
    assert error.rule == "cross-cells" and "the event indicator" in error.reason


def test_survival_counts_release_no_event_of_a_one_event_stratum():
    """A stratified ``survival.counts`` request (Kaplan-Meier, log-rank) is not refused by the
    cross-cell rule: its own horizon rule already releases an event count only where at least
    ``min_count`` events share a cell and grid point, so the one-event stratum's events are
    not released (its curve ends before them)."""
    rng = np.random.default_rng(11)
    centre = np.repeat(["x", "y"], 60)
    event = (rng.random(120) < 0.6).astype(int)
    event[:60] = 0
    event[0] = 1
    frame = pd.DataFrame({"time": rng.uniform(1, 10, 120).round(2), "event": event,
                          "centre": centre})  # fmt: skip
    request = {"time": "time", "event": "event", "group": None, "grid": np.array([5.0, 10.0]),
               "strata": ["centre"], "strata_levels": [["x", "y"]]}  # fmt: skip
    reply = codec.decode(
        Silo("s", frame).handle(codec.encode({"task": "survival.counts", "args": request}))
    )
    assert reply["status"] == "ok", reply
    events = reply["result"]["events"]
    assert events[0].sum() == 0 and not ((events > 0) & (events < DEFAULT.min_count)).any()


def test_levels_agreed_for_a_column_only_read_inside_an_expression_add_no_cell():
    """``I(restecg > 0)`` codes no level of ``restecg``: agreeing its levels (as a study that
    declares every column's levels does) adds no cell to cross, so the recoded heart model is
    answered at Cleveland and Hungary, while its computed indicator is still crossed."""
    from fedstats import datasets

    heart = datasets.heart_disease().only(["cleveland", "hungary"])
    fed = fedstats.Federation.in_process(heart.frames)
    levels = {"restecg": [0, 1, 2], "cp": [1, 2, 3, 4]}
    result = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA, levels=levels).fit(fed)
    assert "I(restecg > 0)" in result.params.index
    with pytest.raises(DisclosureError, match="restecg"):
        fedstats.LogisticRegression(datasets.HEART_FORMULA, levels=levels).fit(fed)
