"""A fitted logistic regression is scored (``logistic.evaluate``) only where its fit ends.

Scoring is an exact release at coefficients: at ``beta`` of the coordinator's choosing, the
number of correct classifications at one site is a count of patients on one side of a
half-space, and moving the half-space moves single patients across it (the half-space attack
of ``test_verified_paths``, through accuracy instead of the score). A site that verifies paths
answers only at the point the fit's relayed, signed last round leads to (one Newton step past
it, re-derived by the site), on the fit's design; held-out sites check it when they pin the
fit's sites' keys. Every refusal comes before a row is read.
"""

from __future__ import annotations

import pytest

import fedstats
from fedstats import datasets
from fedstats.contract.paths import PATH_KEY
from fedstats.site.handlers import classifier_scores

FORMULA = datasets.HEART_EXACT_FORMULA.replace("C(cp)", "I(cp == 3) + I(cp == 4)")
SITES = ("cleveland", "hungary")
POLICY = fedstats.DisclosurePolicy(max_parameter_ratio=0.5, min_count=1)
TASK = "logistic.evaluate"


@pytest.fixture(scope="module")
def split():
    train, test = datasets.heart_disease_split()
    return {s: train[s] for s in SITES}, {s: test[s] for s in SITES}


@pytest.fixture
def rows_read(monkeypatch) -> list[str]:
    """Records every design a scoring site builds (a refusal must come before)."""
    read: list[str] = []
    real = classifier_scores.build_design
    monkeypatch.setattr(
        classifier_scores,
        "build_design",
        lambda *a, **k: read.append("rows") or real(*a, **k),
    )
    return read


def scored(federation, fit, **changes) -> dict:
    args = {"design": fit.design, "beta": fit.params.to_numpy(), PATH_KEY: fit.path_evidence}
    args.update(changes)
    return federation.request(TASK, {k: v for k, v in args.items() if v is not None},
                              analysis="scoring")  # fmt: skip


def refused(federation, fit, **changes) -> str:
    with pytest.raises(fedstats.DisclosureError) as error:
        scored(federation, fit, **changes)
    assert error.value.rule == "path", error.value
    return str(error.value)


def test_scores_at_crafted_coefficients_are_refused_at_training_and_held_out_sites(
    split, rows_read
):
    """The fit's own end point is scored at the training sites and at held-out sites pinned
    with their keys. Moved by 1e-6, scaled by 1e6 (the half-space), stepped once more past
    a fit stopped after two rounds, without the relayed round, on another formula, or with
    one relayed reply changed: refused, rule ``path``, and no row read."""
    train, test = split
    training = fedstats.Federation.in_process(train, disclosure=POLICY)
    fit = fedstats.LogisticRegression(FORMULA).fit(training)
    held_out = fedstats.Federation.in_process(test, disclosure=POLICY, keys_of=training)
    beta = fit.params.to_numpy()
    moved = beta.copy()
    moved[1] += 1e-6
    other = fedstats.LogisticRegression(FORMULA.replace(" + I(cp == 4)", "")).fit(training)
    evidence = fit.path_evidence
    replies = dict(evidence["previous"]["replies"])
    changed = {**replies[SITES[0]], "reply": {**replies[SITES[0]]["reply"]}}
    changed["reply"]["gradient"] = changed["reply"]["gradient"] * 2.0
    tampered = {**evidence, "previous": {**evidence["previous"],
                                         "replies": {**replies, SITES[0]: changed}}}  # fmt: skip
    with pytest.warns(fedstats.ConvergenceWarning):  # stopped two rounds in: big steps
        early = fedstats.LogisticRegression(FORMULA, maxiter=2).fit(training)
    early_end = early.params.to_numpy()
    stepped_twice = early_end + (early_end - early.path_evidence["previous"]["beta"])
    for federation in (training, held_out):
        refused(federation, fit, beta=moved)
        refused(federation, fit, beta=beta * 1e6)
        refused(federation, early, beta=stepped_twice)
        refused(federation, fit, path=None)
        refused(federation, fit, design=other.design)
        refused(federation, fit, path=tampered)
    assert rows_read == []
    for federation in (training, held_out):
        replies = scored(federation, fit)
        assert set(replies) == set(SITES)
        assert set(scored(federation, early)) == set(SITES)
    assert rows_read == ["rows"] * 8
    # a fit that stopped at its last answered point (a singular information) is scored there
    at_last = scored(held_out, fit, beta=evidence["previous"]["beta"])
    assert set(at_last) == set(SITES)


def test_held_out_sites_without_the_fits_keys_refuse_and_plain_sites_answer(split, rows_read):
    """Held-out sites with a roster of their own cannot check the fit's signatures: refused.
    Sites that do not verify paths answer at any coefficients (what verification prevents)."""
    train, test = split
    training = fedstats.Federation.in_process(train, disclosure=POLICY)
    fit = fedstats.LogisticRegression(FORMULA).fit(training)
    strangers = fedstats.Federation.in_process(test, disclosure=POLICY)
    message = refused(strangers, fit)
    assert "not signed by the key" in message or "roster" in message
    plain = fedstats.Federation.in_process(test, disclosure=POLICY, verified_paths=False)
    assert set(scored(plain, fit, beta=fit.params.to_numpy() * 1e6)) == set(SITES)


def test_a_fit_over_sites_that_verify_nothing_is_refused_by_verifying_held_out_sites(split):
    """A fit over sites that verify no path relays no round (they keep none): held-out sites
    that verify refuse to score it (rule ``path``), naming the relayed point they need."""
    train, test = split
    unverified = fedstats.Federation.in_process(train, disclosure=POLICY, verified_paths=False)
    fit = fedstats.LogisticRegression(FORMULA).fit(unverified)
    assert fit.path_evidence is None
    held_out = fedstats.Federation.in_process(test, disclosure=POLICY, keys_of=unverified)
    with pytest.raises(fedstats.DisclosureError) as error:
        fedstats.classification_metrics(fit, held_out)
    assert error.value.rule == "path"
    assert "relays its fit's last point" in str(error.value)
