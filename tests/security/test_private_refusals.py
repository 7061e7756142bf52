"""Nothing leaks through success or failure under privacy.

The attack: a site with ``require_privacy = true`` answers only private
requests, but whether it answered was itself a release no ledger charged. A
private ``prepare`` whose outcome is ``I(disease + ((age == a) & (chol == c)))``
is 0/1 on every row only if the patient aged ``a`` with cholesterol ``c`` has
no disease; the site's "not a binary outcome" refusal then gave that
patient's disease away, ok against error, for the epsilon of three noisy
counts (8 of 8 patients read for epsilon 0.0035 in all).

Now every private request is answered or refused on the request alone and
the site's public metadata (:func:`fedstats.site.private_rows.check_private_request`,
before the charge and before any row is read), and its release leaves
unusable rows out instead of refusing them. The tests check the outcome
itself: the status (and error type and rule) of a crafted private request is
the same whatever one patient's values are, and with or without that patient.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.contract.design import DesignSpec
from fedstats.site.silo import Silo

STUDY = "st"
LEDGERS = itertools.count()
GRID = np.array([100.0, 200.0, 400.0])


def frame(n: int = 80, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.integers(30, 80, n).astype(float),
            "chol": rng.integers(150, 350, n).astype(float),
            "sex": rng.choice(["female", "male"], n),
            "disease": (rng.random(n) < 0.4).astype(int),
            "time": rng.exponential(200, n).round(1),
            "death": rng.integers(0, 2, n),
        }
    )


def design(formula: str, outcome: str, variables, columns, levels=None) -> dict:
    kind = "survival" if outcome.startswith("Surv(") else "binary"
    return DesignSpec(
        outcome_kind=kind,
        formula=formula,
        outcome=outcome,
        variables=tuple(variables),
        levels=levels or {},
        columns=tuple(columns),
        site_intercepts=False,
        sites=("s",),
    ).to_wire()


def dp(*fields: str) -> dict:
    return {
        "noise_multipliers": {f: 5.0 for f in fields},
        "study": STUDY,
        "analysis": "probe",
        "note": "",
    }


def silo_for(data: pd.DataFrame, tmp_path, name: str = "s") -> Silo:
    ledger = accounting.Ledger(tmp_path / f"{name}-{next(LEDGERS)}.db")
    scope = accounting.Scope(unit="patient", owner="s", study=STUDY)
    ledger.set_budget(scope, epsilon=1e4, delta=1e-5)
    policy = fedstats.DisclosurePolicy(require_privacy=True)
    return Silo("s", data, policy=policy, ledger=ledger, noise_seed=0)


def ask(silo: Silo, task: str, args: dict) -> dict:
    return codec.decode(silo.handle(codec.encode({"task": task, "args": args})))


def outcome_of(reply: dict) -> tuple:
    """What success or failure says: the status, and an error's type and rule."""
    if reply["status"] == "ok":
        return ("ok", tuple(sorted(reply["result"])))
    error = reply["error"]
    return ("error", error["type"], error.get("values", {}).get("rule"))


def logistic_args(formula, outcome, variables, columns, levels=None, missing="raise") -> dict:
    wire = design(formula, outcome, variables, columns, levels)
    wire["missing"] = missing
    p = len(columns)
    return {
        "design": wire,
        "beta": np.zeros(p),
        "clip": {"row_norm": 2.0, "scaling": np.tile([0.0, 400.0], (p, 1))},
        "dp": dp("gradient", "hessian"),
    }


# Crafted private requests: each reads a column whose usability hinges on one patient's values
# (a log of zero, a division by zero, a square root of a negative number, a comparison), with
# missing values refused by the design, a categorical level and a survival outcome.
PROBE = "((age == {a}) & (chol == {c}))"


def crafted_requests(a: float, c: float) -> list[tuple[str, dict]]:
    probe = PROBE.format(a=a, c=c)
    log_term = f"log(1 - {probe} * disease)"
    ratio = f"I(age / (1 - {probe}))"
    root = f"sqrt(1 - 2 * {probe})"
    either = f"I((disease == 1) | (age == {a}) & (chol == {c}))"  # as the parser spells it
    cases = [
        ("prepare", {"design": design(f"disease ~ {log_term}", "disease",
                                      ["disease", "age", "chol"], ["Intercept", log_term]),
                     "dp": dp("n_obs")}),
        ("logistic.summaries", logistic_args(f"disease ~ {ratio} + C(sex)", "disease",
                                             ["disease", "age", "chol", "sex"],
                                             ["Intercept", ratio, "C(sex)[T.male]"],
                                             levels={"sex": ["female", "male"]})),
        ("logistic.summaries", logistic_args(f"{either} ~ {root}", either,
                                             ["disease", "age", "chol"], ["Intercept", root])),
        ("survival.counts", {"time": "time", "event": "death", "group": "sex",
                             "levels": ["female", "male"], "grid": GRID,
                             "dp": dp("events")}),
        ("cox.piecewise_summaries", {
            "design": design(f"Surv(time, death) ~ {log_term}", "Surv(time, death)",
                             ["time", "death", "disease", "age", "chol"], [log_term]),
            "beta": np.zeros(1), "alpha": np.zeros(len(GRID)), "grid": GRID,
            "clip": {"row_norm": 1.0, "scaling": np.array([[0.0, 1.0]])},
            "patient_bounds": {"score": 8.0, "information": 12.0},
            "dp": dp("gradient", "hessian")}),
    ]  # fmt: skip
    return cases


def test_the_require_privacy_probe_is_refused_alike_for_every_patient(tmp_path):
    """The attack of the module docstring, on 8 patients: the crafted outcome is refused from
    the request (its 0/1-ness would depend on values), before any charge, the same way for
    every patient, whatever the patient's disease."""
    data = frame()
    silo = silo_for(data, tmp_path)
    replies = []
    for i in range(8):
        a, c = data.loc[i, "age"], data.loc[i, "chol"]
        outcome = f"I(disease + {PROBE.format(a=a, c=c)})"
        wire = design(f"{outcome} ~ age", outcome, ["disease", "age", "chol"], ["Intercept", "age"])
        replies.append(ask(silo, "prepare", {"design": wire, "dp": dp("n_obs")}))
    assert {outcome_of(r) for r in replies} == {("error", "DisclosureError", "private-request")}
    assert {len(set(data.loc[:7, "disease"]))} == {2}  # the 8 patients hold both outcomes
    scope = accounting.Scope(unit="patient", owner="s", study=STUDY)
    assert silo.ledger.spent(scope, pld=False).epsilon == 0  # refused before the charge


@pytest.mark.parametrize("case", range(5))
def test_a_crafted_request_is_answered_alike_whatever_one_patient_holds(tmp_path, case):
    """Each crafted request is answered for every one of 6 target patients, with the target's
    outcome 0 and 1: the status never depends on it."""
    data = frame()
    outcomes = set()
    for i in range(6):
        for disease in (0, 1):
            changed = data.copy()
            changed.loc[i, "disease"] = disease
            a, c = changed.loc[i, "age"], changed.loc[i, "chol"]
            task, args = crafted_requests(a, c)[case]
            outcomes.add(outcome_of(ask(silo_for(changed, tmp_path), task, args)))
    assert len(outcomes) == 1 and next(iter(outcomes))[0] == "ok", outcomes


ODD_NUMBERS = st.sampled_from(
    [np.nan, np.inf, -np.inf, -1.0, 0.0, 1.0, 2.0, 0.5, 1e308, -1e308, 63.0, 233.0]
)
ODD_LEVELS = st.sampled_from([np.nan, "secret", "female", "male", ""])
"""A neighbouring frame has the site's schema (its columns and their kinds are public, in its
fingerprint); any value of a column's kind may stand in one patient's row."""


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.integers(0, 4),
    target=st.integers(0, 79),
    values=st.fixed_dictionaries(
        {"sex": ODD_LEVELS, **{c: ODD_NUMBERS for c in ("age", "chol", "disease", "time", "death")}}
    ),
    drop=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_no_private_status_depends_on_one_patients_values(case, target, values, drop, seed):
    """Neighbouring frames — one patient's row replaced by arbitrary values (missing, infinite,
    negative, out of level, a secret text), or removed — give the same status, error type and
    rule for every crafted private request (hypothesis)."""
    data = frame(seed=seed)
    a, c = data.loc[target, "age"], data.loc[target, "chol"]
    task, args = crafted_requests(a, c)[case]
    if drop:
        neighbour = data.drop(index=target)
    else:
        neighbour = data.astype({c: float for c in ("disease", "death")})
        for column, value in values.items():
            neighbour.loc[target, column] = value
    with tempfile.TemporaryDirectory() as folder:
        base = outcome_of(ask(silo_for(data, Path(folder), "a"), task, args))
        other = outcome_of(ask(silo_for(neighbour, Path(folder), "b"), task, args))
    assert base == other, (base, other)


def test_a_private_release_with_no_usable_row_is_answered(tmp_path):
    """A term usable on no row leaves every row out: the release is still answered (noise
    alone), as one on every row is, so emptiness is no signal either."""
    data = frame()
    term = "log(age - 1000)"
    args = logistic_args(f"disease ~ {term}", "disease", ["disease", "age"], ["Intercept", term])
    reply = ask(silo_for(data, tmp_path), "logistic.summaries", args)
    assert reply["status"] == "ok"


def test_a_private_request_naming_a_missing_column_is_refused_before_the_charge(tmp_path):
    """Column names are the site's public metadata: a request naming one the site lacks is
    refused before the charge (the same for every patient)."""
    silo = silo_for(frame(), tmp_path)
    args = logistic_args("disease ~ weight", "disease", ["disease", "weight"],
                         ["Intercept", "weight"])  # fmt: skip
    reply = ask(silo, "logistic.summaries", args)
    assert reply["status"] == "error"
    silo.policy = silo._context.policy = fedstats.DisclosurePolicy()  # a site that says why
    assert ask(silo, "logistic.summaries", args)["error"]["type"] == "MissingColumnError"
    scope = accounting.Scope(unit="patient", owner="s", study=STUDY)
    assert silo.ledger.spent(scope, pld=False).epsilon == 0


def test_missing_values_leave_rows_out_of_a_private_release_and_are_counted_noisily(tmp_path):
    """``missing="raise"`` cannot be honoured privately without saying whether one patient has
    a missing value; a private ``prepare`` leaves incomplete rows out and releases their
    number only with noise."""
    data = frame()
    data.loc[[1, 2, 3, 4, 5, 6], "age"] = np.nan
    silo = silo_for(data, tmp_path)
    wire = design("disease ~ age", "disease", ["disease", "age"], ["Intercept", "age"])
    reply = ask(silo, "prepare", {"design": wire, "dp": dp("n_obs")})
    assert reply["status"] == "ok"
    assert reply["result"]["n_dropped"] != 6  # noisy: continuous Gaussian noise was added
    scope = accounting.Scope(unit="patient", owner="s", study=STUDY)
    assert silo.ledger.spent(scope, pld=False).epsilon > 0


def test_the_exact_path_still_refuses_bad_values():
    """An exact request keeps its typed refusals (a site that answers exactly says what is
    wrong): the total mode is for private releases only."""
    data = frame()
    data.loc[3, "disease"] = 2
    silo = Silo("s", data)
    wire = design("disease ~ age", "disease", ["disease", "age"], ["Intercept", "age"])
    reply = ask(silo, "prepare", {"design": wire})
    assert reply["error"]["type"] == "NonBinaryOutcomeError"


def test_a_malformed_private_design_is_refused_before_the_charge(tmp_path):
    """A design whose variables do not match its formula is refused from the request alone:
    nothing is charged (it was refused only in the handler, after the charge)."""
    silo = silo_for(frame(), tmp_path)
    args = logistic_args("disease ~ age", "disease", ["disease", "age", "chol"],
                         ["Intercept", "age"])  # fmt: skip
    reply = ask(silo, "logistic.summaries", args)
    assert reply["status"] == "error"
    scope = accounting.Scope(unit="patient", owner="s", study=STUDY)
    assert silo.ledger.spent(scope, pld=False).epsilon == 0


def _release_tasks() -> list[str]:
    from test_dp_per_patient import private_tasks

    return [t.name for t in private_tasks() if t.private_release is not None]


def recording_silo(
    tmp_path, epsilon: float
) -> tuple[Silo, accounting.Ledger, accounting.Scope, list]:
    """A silo over 40 random patients whose private tasks record each handler call (the
    handler is the only code that reads a task's rows), with a ledger budget of ``epsilon``."""
    import dataclasses

    from test_dp_per_patient import private_tasks

    from fedstats.site.task import TaskRegistry

    called: list[str] = []

    def recorded(task):
        return lambda ctx, args: called.append(task.name) or task.handler(ctx, args)

    registry = TaskRegistry([dataclasses.replace(t, handler=recorded(t)) for t in private_tasks()])
    rng = np.random.default_rng(0)
    n = 40
    data = pd.DataFrame(
        {"x": rng.uniform(-4, 4, n), "w": rng.uniform(-4, 4, n), "y": rng.integers(0, 2, n),
         "t": rng.uniform(0.1, 5, n), "e": rng.integers(0, 2, n)}
    )  # fmt: skip
    ledger = accounting.Ledger(tmp_path / "recording.ledger")
    scope = accounting.Scope(unit="patient", owner="only", study="st")
    ledger.set_budget(scope, epsilon=epsilon, delta=1e-5)
    return Silo("only", data, ledger=ledger, registry=registry), ledger, scope, called


@pytest.mark.parametrize("task", _release_tasks())
def test_every_private_release_over_budget_is_refused_before_its_handler_runs(task, tmp_path):
    """For every Gaussian-release task of the registry: over budget, the request is refused
    (``BudgetExceededError``) with nothing charged and the handler — the only code that reads
    the task's rows — never called."""
    from test_dp_per_patient import CASES

    silo, ledger, scope, called = recording_silo(tmp_path, epsilon=1e-6)
    reply = ask(silo, task, CASES[task](0))
    assert reply["status"] == "error" and reply["error"]["type"] == "BudgetExceededError"
    assert called == [] and ledger.entries(scope) == []


@pytest.mark.parametrize("task", ["logistic.summaries", "cox.piecewise_summaries"])
def test_coefficients_beyond_the_clipped_bound_are_refused_before_the_charge(task, tmp_path):
    """``B ||beta||`` past the bound that keeps every patient's term finite is refused from
    the request alone (the task's schema): nothing charged, the handler never called."""
    from test_dp_per_patient import CASES

    silo, ledger, scope, called = recording_silo(tmp_path, epsilon=100)
    args = CASES[task](0)
    args["beta"] = np.full(len(args["beta"]), 1e6)
    reply = ask(silo, task, args)
    assert reply["status"] == "error" and reply["error"]["type"] == "MalformedRequestError"
    assert "beta" in reply["error"]["values"]["reason"]
    assert called == [] and ledger.entries(scope) == []
