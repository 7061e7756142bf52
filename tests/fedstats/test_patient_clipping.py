"""The per-patient norms a private release clips by, against the matrices they stand for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedstats.site.handlers.cox_private import patient_information_norms
from fedstats.site.handlers.logistic import patient_clipped
from fedstats.site.patient_clipping import (
    crowded_patients,
    gram_frobenius,
    patient_clip_factors,
    patient_sums,
    within_patient_pairs,
)


@st.composite
def patients_and_rows(draw):
    """Patient codes of 1 to 5 rows each (in shuffled order), ``p`` covariates, weights and ``k``
    exposures; with ``p`` (and ``K + p``) small, patients of more rows take the matrix path."""
    p, k = draw(st.sampled_from([(1, 1), (3, 4)]))
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=15))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    patients = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    n = len(patients)
    return patients, rng.normal(size=(n, p)), rng.uniform(0, 0.25, n), rng.uniform(0, 2, (n, k))


@settings(max_examples=60, deadline=None)
@given(patients_and_rows())
def test_pairs_are_every_ordered_pair_of_one_patients_rows(drawn):
    patients = drawn[0]
    first, second, owner = within_patient_pairs(patients)
    expected = {
        (r, s) for r in range(len(patients)) for s in range(len(patients))
        if patients[r] == patients[s]
    }  # fmt: skip
    assert sorted(zip(first.tolist(), second.tolist(), strict=True)) == sorted(expected)
    assert (patients[first] == owner).all() and (patients[second] == owner).all()
    sizes = np.bincount(patients)
    first, second, owner = within_patient_pairs(patients, max_rows=2)
    small = {(r, s) for r, s in expected if sizes[patients[r]] <= 2}
    assert sorted(zip(first.tolist(), second.tolist(), strict=True)) == sorted(small)
    assert (patients[first] == owner).all()
    crowded = crowded_patients(patients, 2)
    assert [i for i, _ in crowded] == np.flatnonzero(sizes > 2).tolist()
    for i, rows in crowded:
        assert sorted(rows.tolist()) == np.flatnonzero(patients == i).tolist()


@settings(max_examples=60, deadline=None)
@given(patients_and_rows())
def test_gram_frobenius_is_the_norm_of_each_patients_summed_information(drawn):
    patients, X, w, _ = drawn
    for i, norm in enumerate(gram_frobenius(patients, X, w)):
        rows = patients == i
        summed = (X[rows] * w[rows, None]).T @ X[rows]
        np.testing.assert_allclose(norm, np.linalg.norm(summed), rtol=1e-10, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(patients_and_rows())
def test_piecewise_cox_information_norm_is_that_of_the_summed_block_matrix(drawn):
    """``H_i = [[diag(mu), mu x'], [x mu', Lambda x x']]`` summed over a patient's rows."""
    patients, X, _, mu = drawn
    norms = patient_information_norms(patients, X, mu)
    for i, norm in enumerate(norms):
        total = 0.0
        for r in np.flatnonzero(patients == i):
            total = total + np.block(
                [[np.diag(mu[r]), np.outer(mu[r], X[r])],
                 [np.outer(X[r], mu[r]), mu[r].sum() * np.outer(X[r], X[r])]]
            )  # fmt: skip
        np.testing.assert_allclose(norm, np.linalg.norm(total), rtol=1e-10, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(patients_and_rows(), st.floats(0.1, 5.0))
def test_each_patients_clipped_sum_is_within_the_bound_and_unclipped_within_it(drawn, bound):
    patients, X, _, _ = drawn
    factors = patient_clip_factors(patients, X, bound)
    sums = patient_sums(patients, X)
    clipped = patient_sums(patients, X * factors[:, None])
    norms = np.linalg.norm(clipped, axis=1)
    assert (norms <= bound * (1 + 1e-12)).all()
    within = np.linalg.norm(sums, axis=1) <= bound
    np.testing.assert_allclose(clipped[within], sums[within])


@settings(max_examples=40, deadline=None)
@given(patients_and_rows())
def test_one_row_per_patient_gives_the_row_clipped_logistic_release(drawn):
    """With rows already within the bounds (``||x|| <= B``, ``|y - mu| <= 1``,
    ``mu (1 - mu) <= 1/4``) and one row per patient, nothing is clipped: the plain sums."""
    _, X, w, _ = drawn
    X = X / np.maximum(np.linalg.norm(X, axis=1), 1.0)[:, None]  # rows of norm <= B = 1
    residual = np.random.default_rng(0).uniform(-1, 1, len(X))
    args = {"clip": {"row_norm": 1.0, "scaling": np.tile([0.0, 1.0], (X.shape[1], 1))}}
    released = patient_clipped(args, X, residual, w, np.arange(len(X)))
    np.testing.assert_allclose(released["gradient"], X.T @ residual, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(released["hessian"], X.T @ (X * w[:, None]), rtol=1e-12)
