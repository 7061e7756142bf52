"""An adversarial reconstruction of a real site (heart disease, Cleveland) recovers nothing.

The attack that rebuilt all 303 Cleveland rows in 4 requests: design columns
that are the indicator of one patient (or of one row) turn the exact score
at beta = 0 into that patient's outcome (score_j = sum_i x_ij (y_i - 1/2))
and the information matrix into their covariates (H_jk = sum_i x_ij x_ik / 4);
pairs of columns whose row sets differ by one patient give the same by
difference; crafted outcomes and error replies carry the rest. Here a
coordinator runs all of them, through the public design agreement and raw
``logistic.summaries`` requests, against the Cleveland site with the
default rules, and must recover no patient's outcome or covariates.
"""

from __future__ import annotations

import numpy as np
import pytest
from formulaic import model_matrix

import fedstats
from fedstats.contract import codec
from fedstats.contract.paths import PATH_KEY, PathRequest
from fedstats.datasets import heart_disease
from fedstats.errors import FedstatsError
from fedstats.models.agree import agree_design

N_TARGETS = 12


@pytest.fixture(scope="module")
def cleveland():
    return heart_disease().frames["cleveland"]


def exact_summaries(fed: fedstats.Federation, formula: str) -> tuple[list[str], np.ndarray]:
    """The coordinator's probe: agree the design, then ask for the score at beta = 0."""
    agreement = agree_design(fed, formula, analysis="probe")
    spec = agreement.spec
    silo = fed.silos["cleveland"]
    start = np.zeros(spec.n_params)
    # beta = 0 is round 1 of any logistic fit's path: a site that verifies paths answers it,
    # so only the design's own rules stand between this probe and the rows
    path = PathRequest(sites=("cleveland",), round=1, base=start).to_wire()
    request = {"design": spec.to_wire(), "beta": start, PATH_KEY: path}
    reply = codec.decode(silo.handle(codec.encode({"task": "logistic.summaries", "args": request})))
    if reply["status"] != "ok":
        raise FedstatsError(str(reply["error"]))
    return list(spec.columns), reply["result"]["gradient"]


def probes(frame) -> list[tuple[int, str]]:
    """(target patient, formula) pairs: every attack of the issue against the first patients."""
    out = []
    for i in range(N_TARGETS):
        age, chol = int(frame.age[i]), int(frame.chol[i])
        one = f"(age == {age}) & (chol == {chol})"
        out += [
            (i, f"disease ~ I({one})"),  # indicator column of one patient
            (i, f"disease ~ I(age.index == {i})"),  # row indicator
            (i, f"disease ~ I((age >= 60) | ({one}))"),  # a large set plus one patient
            (i, f"disease ~ I((age >= 60) & ~({one}))"),  # the same minus one patient
            (i, f"disease ~ I(1 / (1 + 1000000 * ((age - {age}) ** 2 + (chol - {chol}) ** 2)))"),
            (i, f"I(disease + 2 * ({one})) ~ age"),  # crafted outcome, read through its error
            (i, f"I({one}) ~ age"),  # crafted outcome: the patient is the only event
            (i, f"disease ~ I(chol >= {chol}) + I(chol >= {chol + 1})"),  # differencing pair
        ]
    return out


def answered_columns(frame, formula: str) -> list[np.ndarray]:
    """Oracle (the attacker's own evaluation, with formulaic on the true rows): the values
    of the non-intercept design columns a probe's answer is a sum over."""
    matrix = model_matrix(formula.split("~", 1)[1], frame)
    return [matrix[c].to_numpy(dtype=float) for c in matrix.columns if c != "Intercept"]


def isolates_few(v: np.ndarray, k: int) -> bool:
    """Whether a column's answer would tell about fewer than k patients: it differs from its
    most common value on 1..k-1 rows, or one patient holds most of its variation."""
    _, counts = np.unique(v, return_counts=True)
    differing = len(v) - counts.max()
    deviation = np.abs(v - np.median(v))
    return 0 < differing < k or (deviation.sum() > 0 and deviation.max() > 0.5 * deviation.sum())


def test_no_patient_is_recovered_from_cleveland(cleveland):
    fed = fedstats.Federation.in_process({"cleveland": cleveland})
    k = fed.silos["cleveland"].policy.k_cell
    answered, refused = [], []
    for _target, formula in probes(cleveland):
        try:
            exact_summaries(fed, formula)
            answered.append(formula)
        except FedstatsError as error:
            refused.append(type(error).__name__)
    columns = [v for formula in answered for v in answered_columns(cleveland, formula)]
    leaks = [v for v in columns if isolates_few(v, k)]
    pairs = [
        (a, b)
        for i, a in enumerate(columns)
        for b in columns[i + 1 :]
        if set(np.unique(a)) <= {0.0, 1.0} and set(np.unique(b)) <= {0.0, 1.0}
        and 0 < int(np.sum(a != b)) < k
    ]  # fmt: skip
    assert not leaks and not pairs, f"answered probes that isolate patients: {answered}"
    # every probe that isolates one patient was refused outright, with a typed error
    assert not [f for f in answered if "index" in f or "==" in f]
    assert len(refused) >= 6 * N_TARGETS


def test_the_probe_decoder_works_on_a_group_the_rules_allow(cleveland):
    """Control: the same probe on a column covering many patients is answered, and decodes to
    that group's sum of (y - 1/2) — so the attack's silence above is the rules, not the code."""
    fed = fedstats.Federation.in_process({"cleveland": cleveland})
    columns, gradient = exact_summaries(fed, "disease ~ I(age >= 60)")
    group = (cleveland.age >= 60).to_numpy()
    expected = float(np.sum(cleveland.disease.to_numpy()[group] - 0.5))
    j = next(j for j, c in enumerate(columns) if c != "Intercept")
    assert gradient[j] == pytest.approx(expected, abs=1e-9)


def test_each_refusal_names_the_site_and_the_task(cleveland):
    fed = fedstats.Federation.in_process({"cleveland": cleveland})
    age, chol = int(cleveland.age[0]), int(cleveland.chol[0])
    with pytest.raises(fedstats.errors.DisclosureError) as info:
        fedstats.LogisticRegression(f"disease ~ I((age == {age}) & (chol == {chol}))").fit(fed)
    assert info.value.site == "cleveland" and info.value.task == "prepare"
    assert info.value.rule == "cells" and f"chol == {chol}" in str(info.value)
    with pytest.raises(fedstats.errors.FormulaError) as refused:
        fedstats.LogisticRegression("disease ~ I(age.index == 3)").fit(fed)
    assert "index" in str(refused.value)
