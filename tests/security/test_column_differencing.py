"""Columns that differ on a few rows: the differencing guard remembers answered columns.

The attack: two exact answers over columns that agree on every row but one give that
row's terms by subtraction. Fit ``disease ~ chol``, then ``disease ~ chol_lab`` where
``chol_lab`` (a second laboratory's value, say) equals ``chol`` except on one patient:
the first round's ``X'y`` and ``X'X`` sums differ by that patient's terms, and with a
few such pairs (or the intercept's sums) the patient's cholesterol and disease come
out. The same holds for two weights columns, for an affine near-copy
(``I(2 * chol_lab + 7)`` against ``chol``), for a near-copy the coordinator writes in
a formula (``I(chol + 1 / (1 + 1e6 * (thalach - v) ** 2))``, ``chol`` to within ``1e-6``
on every row but the one patient with ``thalach == v``), and on a frame with several rows per
patient for a column that differs on all the rows of one patient. Each is refused with
a typed :class:`~fedstats.errors.DisclosureError` (rule ``differencing``). Honest use
is answered: the same column asked again (in the run or after a restart), a column
that differs on ``k`` or more rows, and a model-building sequence on the heart-disease
data.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.contract import codec
from fedstats.datasets import heart_disease
from fedstats.errors import DisclosureError
from fedstats.models.agree import agree_design, agreed_design
from fedstats.site.handlers.design import distinct_values_exceed
from fedstats.site.near_copies import RTOL, anchor_pairs, extreme_values, near_copies
from fedstats.site.silo import Silo

K = fedstats.DisclosurePolicy().k_cell
ROW = 7
"""The patient the attacks single out."""


@pytest.fixture(scope="module")
def cleveland() -> pd.DataFrame:
    """Cleveland's 303 patients with columns a coordinator might pair: a second
    cholesterol differing on one patient (or on ``K``), two weights differing on one."""
    data = heart_disease().frames["cleveland"].reset_index(drop=True)
    rng = np.random.default_rng(0)
    lab = data.chol.astype(float).copy()
    lab[ROW] += 13.0
    far = data.chol.astype(float).copy()
    far[[ROW, 40, 80, 120][:K]] += 13.0
    w1 = rng.integers(1, 4, len(data)).astype(float)
    w2 = w1.copy()
    w2[ROW] += 1.0
    return data.assign(chol_lab=lab, chol_far=far, w1=w1, w2=w2)


def federation(data: pd.DataFrame, path=None) -> tuple[Silo, fedstats.Federation]:
    silo = Silo("cleveland", data, guard_path=path)
    return silo, fedstats.Federation({"cleveland": silo.handle})


def refused(fed: fedstats.Federation, formula: str, **options) -> DisclosureError:
    with pytest.raises(DisclosureError) as info:
        agree_design(fed, formula, analysis="second", **options)
    assert info.value.site == "cleveland" and info.value.task == "prepare"
    assert info.value.rule == "differencing", info.value.reason
    return info.value


def one_patient_thalach(data: pd.DataFrame) -> int:
    counts = data.thalach.value_counts()
    return int(next(v for v in sorted(counts.index) if counts[v] == 1 and v > 140))


# ------------------------------------------------------------------ attacks


def test_two_continuous_columns_differing_on_one_patient(cleveland):
    _, fed = federation(cleveland)
    fedstats.LogisticRegression("disease ~ chol").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("disease ~ chol_lab").fit(fed)
    assert info.value.rule == "differencing" and "chol_lab" in info.value.reason


def test_two_continuous_outcomes_differing_on_one_patient(cleveland):
    _, fed = federation(cleveland)
    fedstats.GLM("chol ~ age", family="gaussian").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("chol_lab ~ age", family="gaussian").fit(fed)
    assert info.value.rule == "differencing"


def test_two_weights_columns_differing_on_one_patient(cleveland):
    _, fed = federation(cleveland)
    fedstats.GLM("disease ~ age", family="binomial", weights="w1").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("disease ~ age", family="binomial", weights="w2").fit(fed)
    assert info.value.rule == "differencing" and "w2" in info.value.reason


def test_weights_that_count_one_patient_twice(cleveland):
    """Weights of 1 but 2 for one patient, against the unweighted fit (weights all 1): the
    two answers differ by that patient's terms."""
    _, fed = federation(cleveland.assign(w=np.where(cleveland.index == ROW, 2.0, 1.0)))
    fedstats.GLM("disease ~ age + chol", family="binomial").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("disease ~ age + chol", family="binomial", weights="w").fit(fed)
    assert info.value.rule in ("cells", "differencing")


@pytest.mark.parametrize("near_copy", ["I(2 * chol_lab + 7)", "I(-chol_lab / 38.67 + 1)"])
def test_an_affine_near_copy(cleveland, near_copy):
    _, fed = federation(cleveland)
    agree_design(fed, "disease ~ chol", analysis="first")
    refused(fed, f"disease ~ {near_copy}")


def test_a_near_copy_written_in_the_formula(cleveland):
    """``1 / (1 + 1e6 (thalach - v)^2)`` is 1 for the one patient with ``thalach == v`` and
    at most ``1e-6`` for everyone else (integer ``thalach``): no indicator for the cell
    rules, and the difference of the two answers' sums is that patient's terms to within
    ``3e-4``."""
    v = one_patient_thalach(cleveland)
    _, fed = federation(cleveland)
    agree_design(fed, "disease ~ age + chol", analysis="first")
    refused(fed, f"disease ~ age + I(chol + 1 / (1 + 1e6 * (thalach - {v}) ** 2))")
    refused(fed, f"disease ~ age + I(3 * chol + 0.5 / (1 + 1e8 * (thalach - {v}) ** 2))")


def test_a_near_copy_of_another_column_of_the_same_request(cleveland):
    _, fed = federation(cleveland)
    refused(fed, "disease ~ chol + chol_lab")


def test_a_near_copy_is_refused_after_a_restart_and_on_the_wire(cleveland, tmp_path):
    path = tmp_path / "guard.sqlite"
    first, fed = federation(cleveland, path)
    agree_design(fed, "disease ~ chol", analysis="first")
    first._context.guard.close()
    again, fed = federation(cleveland, path)
    spec, _ = agreed_design(fed, "disease ~ chol_lab", analysis="second")
    raw = {"task": "prepare", "args": {"design": spec.to_wire()}}
    reply = codec.decode(again.handle(codec.encode(raw)))
    assert reply["status"] == "error" and reply["error"]["type"] == "DisclosureError"
    assert reply["error"]["values"]["rule"] == "differencing"
    assert str(13) not in reply["error"]["values"]["reason"]  # names no value
    again._context.guard.close()


def test_a_column_differing_on_every_row_of_one_patient(cleveland):
    """Three rows per patient: ``chol_far`` differs on ``K`` rows, all of one patient."""
    data = cleveland.loc[cleveland.index.repeat(3)].copy()
    data["chol_far"] = data.chol.astype(float)
    data.loc[ROW, "chol_far"] = data.loc[ROW, "chol"] + 13.0  # the index names the patient
    assert (data.chol_far != data.chol).sum() == 3
    _, fed = federation(data)
    agree_design(fed, "disease ~ chol", analysis="first")
    error = refused(fed, "disease ~ chol_far")
    assert "patients" in error.reason


# ------------------------------------------------------------------ honest use


def test_the_same_columns_again_are_answered_in_the_run_and_after_a_restart(cleveland, tmp_path):
    path = tmp_path / "guard.sqlite"
    silo, fed = federation(cleveland, path)
    fedstats.LogisticRegression("disease ~ age + chol").fit(fed)
    entries = silo._context.guard.entries
    fedstats.LogisticRegression("disease ~ age + chol").fit(fed)
    fedstats.LogisticRegression("disease ~ I(age / 10) + I(chol - 200)").fit(fed)  # rescaled
    assert silo._context.guard.entries == entries  # nothing new to remember
    silo._context.guard.close()
    _, fed = federation(cleveland, path)
    fedstats.LogisticRegression("disease ~ age + chol").fit(fed)


def test_a_column_differing_on_k_rows_is_answered(cleveland):
    _, fed = federation(cleveland)
    agree_design(fed, "disease ~ chol", analysis="first")
    agree_design(fed, "disease ~ chol_far", analysis="second")


def test_a_model_building_sequence_on_the_heart_disease_data_is_answered(heart_exact):
    """Seven formulas a statistician would try, at the hospitals that answer the exact demo
    (VA's two healthy women are a cross-cell of sex under the default rules)."""
    fed = fedstats.Federation.in_process(heart_exact.only(["cleveland", "hungary"]).frames)
    for formula in [
        "disease ~ age",
        "disease ~ age + sex",
        "disease ~ age + sex + C(cp)",
        "disease ~ age + sex + C(cp) + trestbps",
        "disease ~ age + sex + C(cp) + trestbps + thalach",
        "disease ~ I(age / 10) + sex + C(cp) + I(trestbps / 10) + thalach",
        "disease ~ age + sex + C(cp) + thalach + exang + oldpeak",
    ]:
        result = fedstats.LogisticRegression(formula).fit(fed)
        assert np.isfinite(result.params).all()


# ------------------------------------------------------------------ the detector


def near_by_the_documented_maps(a: np.ndarray, b: np.ndarray, units: np.ndarray) -> bool:
    """The rule of :mod:`fedstats.site.near_copies` as its docstring states it, row by row in
    pandas: some map ``c a + d`` through two anchor rows of ``b`` leaves a residual (0 within
    ``RTOL``) whose ``K - 1`` patients deviating most from its median hold more than
    ``(K - 1)/K`` of the total; ``b`` dominated by itself is the cell rules' business."""

    def dominated(values: np.ndarray) -> bool:
        per_patient = pd.Series(np.abs(values - np.median(values))).groupby(units).sum()
        top = per_patient.sort_values(ascending=False).iloc[: K - 1].sum()
        return per_patient.sum() > 0 and top > (K - 1) / K * per_patient.sum() * (1 + 1e-12)

    if dominated(b):
        return False
    for i, j in anchor_pairs(b, K):
        if a[i] == a[j]:
            continue
        c = (b[i] - b[j]) / (a[i] - a[j])
        d = b[i] - c * a[i]
        residual = b - (c * a + d)
        rounding = RTOL * (np.abs(b) + np.abs(c * a) + abs(d))
        residual[np.abs(residual) <= rounding] = 0.0
        if dominated(residual):
            return True
    return False


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(20, 120),
    slope=st.sampled_from([1.0, -1.0, 2.0, 0.1, -38.67, 1e3]),
    shift=st.sampled_from([0.0, 7.0, -1e4]),
    changed=st.integers(0, 6),
    size=st.sampled_from([1e-9, 1e-3, 0.1]),
    rows_per_patient=st.integers(1, 3),
)
@example(  # 7 patients: an unrelated column's anchor map leaves a residual 2 patients dominate
    seed=114, n=20, slope=1.0, shift=0.0, changed=3, size=1e-9, rows_per_patient=3
)
def test_the_detector_finds_an_affine_image_changed_on_fewer_than_k_patients(
    seed, n, slope, shift, changed, size, rows_per_patient
):
    """Oracle: ``b`` is ``slope * a + shift`` with ``changed`` rows moved by about ``size``
    times its spread. Near when 1 to ``K - 1`` patients hold the changed rows; when ``K`` or more
    do, near exactly when the ``K - 1`` patients moved most hold more than ``(K - 1)/K``
    of the total move (the dominance rule); a copy when nothing moved; an unrelated column
    is never a copy, and near only when one of the documented maps leaves it a dominated
    residual (with few patients, chance can: a refusal too many, never one too few)."""
    rng = np.random.default_rng(seed)
    a = np.round(rng.normal(200, 40, n), 1)
    b = slope * a + shift
    rows = rng.choice(n, size=min(changed, n), replace=False)
    moves = size * abs(slope) * (40 + np.abs(a[rows]))  # b's spread: it stays a column the
    # cell rules answer about
    b[rows] += moves
    # the detector counts a change within RTOL of the values as rounding (near_copies.RTOL):
    # the oracle speaks of changes well clear of it
    scale = np.abs(b[rows]) + np.abs(slope * a[rows]) + abs(shift)
    assume(bool(np.all(moves > 100 * RTOL * scale)))
    units = np.arange(n) // rows_per_patient
    unrelated = rng.normal(size=(3, n))
    near, copy = near_copies(np.vstack([unrelated, a]), b, K, units)
    moved = pd.Series(moves).groupby(units[rows]).sum()  # per patient
    per_patient = sorted(moved.tolist(), reverse=True)
    patients = len(per_patient)
    dominated = sum(per_patient[: K - 1]) > (K - 1) / K * sum(per_patient)
    assert not copy[:3].any()
    for other, flagged in zip(unrelated, near[:3], strict=True):
        assert flagged == near_by_the_documented_maps(other, b, units)
    assert near[3] == (0 < patients < K or (patients >= K and dominated))
    assert copy[3] == (patients == 0)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(4, 400),
    k=st.integers(2, 5),
    kind=st.sampled_from(["unrelated", "affine", "bump"]),
    changed=st.integers(0, 8),
    size=st.sampled_from([1e-9, 1e-3, 1.0, 100.0]),
    per_patient=st.booleans(),
)
def test_the_screen_never_changes_the_detectors_answer(
    seed, n, k, kind, changed, size, per_patient
):
    """The cheap screens (:class:`fedstats.site.near_copies._Screen`) only skip maps they prove
    neither near nor a copy: with them switched off, every answer is the same."""
    from fedstats.site import near_copies as module

    rng = np.random.default_rng(seed)
    stored = rng.normal(size=(3, n)).round(int(rng.integers(0, 3)))
    if kind == "unrelated":
        column = rng.normal(size=n)
    else:
        column = rng.choice([1.0, -2.0, 0.5, 1e3]) * stored[1] + rng.choice([0.0, 7.0, -1e4])
        rows = rng.choice(n, size=min(changed, n), replace=False)
        column[rows] += size * (1 + rng.random(len(rows)))
        if kind == "bump":
            column += 1.0 / (1 + 1e6 * (stored[1] - stored[1][0]) ** 2)
    units = np.sort(rng.integers(0, max(2, n // 2), n)) if per_patient else None
    screened = near_copies(stored, column, k, units)
    originals = module._Screen.clearly_apart, module._Screen.spread_out
    module._Screen.clearly_apart = lambda self, block, c, *a: np.zeros(c.shape, bool)
    module._Screen.spread_out = lambda self, residual: np.zeros(len(residual), bool)
    try:
        unscreened = near_copies(stored, column, k, units)
    finally:
        module._Screen.clearly_apart, module._Screen.spread_out = originals
    assert np.array_equal(screened[0], unscreened[0])
    assert np.array_equal(screened[1], unscreened[1])


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(-6, 6), min_size=1, max_size=400),
    count=st.integers(1, 9),
    scale=st.sampled_from([1.0, 0.37, -1e6]),
)
def test_the_extreme_values_are_those_of_the_sorted_distinct_values(values, count, scale):
    """Oracle: ``numpy.unique`` (a full sort). The anchors are taken from these values, so
    finding them by partial partition changes no anchor, hence no answer of the detector."""
    column = np.array(values, dtype=np.float64) * scale
    distinct = np.unique(column)
    smallest, largest = extreme_values(column, count)
    np.testing.assert_array_equal(smallest, distinct[:count])
    np.testing.assert_array_equal(largest, distinct[-count:])


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.integers(0, 3), max_size=8), count=st.sampled_from([1, 2]))
def test_a_column_answered_as_values_has_more_distinct_values_than_its_sets_cover(values, count):
    """Oracle: ``numpy.unique``. A column of three or more values goes to the near-copy check;
    one of two values is a row set there, one of a single value is neither."""
    column = np.array(values, dtype=np.float64)
    assert distinct_values_exceed(column, count) == (np.unique(column).size > count)
