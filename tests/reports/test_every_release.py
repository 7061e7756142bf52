"""A compliance report names every analysis that left a site, whatever its task.

An in-process study runs one analysis of every task on the wire — exact and
private logistic regression (with secure aggregation), held-out classification
metrics, a Poisson GLM, exact, robust, grid and private Cox models, Harrell's C,
Kaplan–Meier curves, a log-rank test, cumulative incidence, Fine–Gray, a
TPR-fair logistic fit, heterogeneity (one fit per site) and a trained network
with its evaluation — and records each result with the analyses it started
(``Federation.analyses_started``). The report must tie every analysis in the
message inventory to a result, show that result and name it in the verdict
(:func:`tests.reports.release_checks.assert_every_release_named`); an analysis
left unrecorded must be named in the verdict with a warning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import accounting
import fedstats
from fedstats.contract.tasks import TASKS
from fedstats.models import fairness
from reports import Study, StudyRecorder, build_report
from tests.reports.release_checks import assert_every_release_named
from tests.vertical.linked_frames import vertical_study

pytest.importorskip("torch")

SITES = ("north", "south", "east")
STUDY = "every-release"
BOUNDS = {"age": (20.0, 100.0), "x": (-4.0, 4.0)}


def hospital(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Patients with a binary outcome, a count, survival and two competing causes."""
    age = rng.uniform(30, 90, n)
    x = np.clip(rng.normal(size=n), -4, 4)
    sex = rng.choice(["female", "male"], n)
    arm = rng.choice(["control", "treated"], n)
    y = rng.random(n) < 1 / (1 + np.exp(-(-3.0 + 0.04 * age + 0.6 * x)))
    hazard = np.exp(0.02 * (age - 60) - 0.4 * (arm == "treated")) / 900
    death, other = rng.exponential(1 / hazard), rng.exponential(1800, n)
    end = rng.uniform(365, 3650, n)
    time = np.ceil(np.minimum.reduce([death, other, end]))
    status = np.select([death <= np.minimum(other, end), other < np.minimum(death, end)], [1, 2], 0)
    return pd.DataFrame({
        "age": age, "x": x, "sex": sex, "arm": arm, "y": y.astype(int),
        "visits": rng.poisson(np.exp(0.5 + 0.3 * x)), "time": time,
        "event": (status == 1).astype(int), "status": status,
    })  # fmt: skip


def record_table(recorder, federation, name, kind, run, *, private=False, description=""):
    """Run ``run()`` (which returns a table) and record it as a release with its analyses."""
    with federation.analyses_started() as analyses:
        table = run()
    recorder.record_release(
        name, table, kind=kind, description=description or name, analyses=analyses,
        sites=federation.sites, private=private,
    )  # fmt: skip


@pytest.fixture(scope="module")
def every_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study directory of one analysis of every task, each recorded."""
    from fedstats.deep import FederatedTrainer

    folder = tmp_path_factory.mktemp("every-release")
    rng = np.random.default_rng(29)
    frames = {site: hospital(rng, 700) for site in SITES}
    held_out = {site: hospital(rng, 300) for site in SITES}
    spec = folder / "spec.toml"
    spec.write_text('[study]\nname = "every-release"\n', encoding="utf-8")
    recorder = StudyRecorder(folder / "study", study=STUDY)
    recorder.record_spec(spec)
    recorder.record_configuration({"noise_seed": 7})
    ledgers = {site: recorder.ledger(site) for site in SITES}
    for site, ledger in ledgers.items():
        ledger.set_budget(accounting.Scope(unit="patient", owner=site, study=STUDY), 20.0, 1e-5)
    fed = fedstats.Federation.in_process(frames, study=STUDY, ledgers=ledgers, noise_seed=7)
    scoring = fedstats.Federation.in_process(held_out, study=STUDY, keys_of=fed)
    scoring.inventory = fed.inventory  # one study, one inventory
    fed.verify_fingerprints()

    formula = "y ~ age + x + C(sex)"
    levels = {"sex": ["female", "male"]}
    exact = fedstats.LogisticRegression(formula).fit(fed)
    recorder.record_fit("logistic", exact, description="exact logistic regression")
    private = fedstats.LogisticRegression(formula, levels=levels).fit(
        fed,
        privacy=fedstats.RecordDP(epsilon=2.0, delta=1e-5, bounds=BOUNDS),
        secure_aggregation=fedstats.SecureAggregation(),
    )
    recorder.record_fit("logistic-dp", private, description="record-level DP", reference="logistic")
    record_table(
        recorder, scoring, "logistic-scores", "classification metrics",
        lambda: fedstats.classification_metrics(exact, scoring).to_frame(),
    )  # fmt: skip
    glm = fedstats.GLM("visits ~ age + x", family="poisson").fit(fed)
    recorder.record_fit("visits-poisson", glm, description="Poisson GLM")

    cox = fedstats.CoxPH("Surv(time, event) ~ age + C(arm)", robust=True).fit(fed)
    recorder.record_fit("cox", cox, description="stratified Cox, robust errors")
    grid_cox = fedstats.CoxPH("Surv(time, event) ~ age", strata=None, width=365, horizon=3650)
    recorder.record_fit("cox-grid", grid_cox.fit(fed), description="Cox with a baseline grid")
    private_cox = fedstats.CoxPH("Surv(time, event) ~ age", strata=None, width=730, horizon=3650)
    cox_dp = fedstats.RecordDP(epsilon=2.0, delta=1e-5, rounds=4, bounds={"age": BOUNDS["age"]})
    dp_cox = private_cox.fit(fed, privacy=cox_dp)
    recorder.record_fit("cox-dp", dp_cox, description="record-level DP Cox")
    record_table(
        recorder, scoring, "cox-concordance", "concordance",
        lambda: pd.DataFrame({"harrell_c": [fedstats.concordance_index(cox, scoring)]}),
    )  # fmt: skip
    km = fedstats.KaplanMeier("time", "event", group="arm", width=365, horizon=3650).fit(fed)
    recorder.record_curves("survival-by-arm", km, description="by arm")  # names its analysis

    def logrank() -> pd.DataFrame:
        test = fedstats.logrank_test(fed, "time", "event", "arm", width=365, horizon=3650)
        return pd.DataFrame({"statistic": [test.statistic], "p_value": [test.p_value]})

    record_table(recorder, fed, "logrank-arm", "log-rank test", logrank)
    record_table(
        recorder, fed, "incidence-cause-1", "cumulative incidence table",
        lambda: fedstats.CumulativeIncidence("time", "status", cause=1, width=365,
                                             horizon=3650).fit(fed).to_frame(),
    )  # fmt: skip
    fine_gray = fedstats.FineGray(
        "Surv(time, status) ~ age + C(arm)", cause=1, width=365, horizon=3650, robust=True
    )
    recorder.record_fit("fine-gray", fine_gray.fit(fed), description="Fine–Gray, cause 1")
    record_table(
        recorder, fed, "fair-logistic", "TPR-fair logistic fit",
        lambda: fairness.fit_penalized(
            fedstats.LogisticRegression(formula), fed, groups="sex", gamma=1.0
        ).params.to_frame("coef"),
    )  # fmt: skip
    with fed.analyses_started() as analyses:
        spread = fedstats.heterogeneity(fedstats.LogisticRegression(formula), fed)
    recorder.record_diagnostic(
        "heterogeneity", "one fit per site", spread.summary_frame, analyses=analyses
    )
    trainer = FederatedTrainer(
        "mlp", {"hidden": [8]}, formula="y ~ age + x", bounds=BOUNDS, rounds=2, local_steps=2,
        seed=3, progress=False,
    )  # fmt: skip
    with fed.analyses_started() as analyses:  # trained here, scored at the held-out sites
        network = trainer.fit(fed, evaluation=scoring)
    recorder.record_release(
        "mlp", network.evaluation.to_frame(), kind="trained network", description="an MLP",
        analyses=analyses, sites=fed.sites,
    )  # fmt: skip
    registry_side = vertical_study(  # linked over the wire, in the study's one inventory
        {"clinic": hospital(rng, 200)}, ["y"], seed=3, study=STUDY, wire=True,
        inventory=fed.inventory,
    )  # fmt: skip
    linkage = registry_side.linked["clinic"]
    recorder.record_release(
        "linkage-clinic", pd.DataFrame(linkage.score_histogram), kind="record linkage",
        description="the registry and the clinic linked by the coordinator as linkage unit",
        analyses=registry_side.linkage_analyses, sites=registry_side.federation.sites,
    )  # fmt: skip
    with registry_side.federation.analyses_started() as analyses:
        vertical = fedstats.VerticalLogisticRegression(
            "y ~ age + x", outcome_site="registry", covariate_sites=["clinic"],
            linkage_id="L-clinic",
        ).fit(registry_side.federation)  # fmt: skip
    recorder.record_release(
        "vertical-logistic", vertical.params.to_frame(), kind="vertical logistic regression",
        description="outcome at a registry, covariates at a linked clinic", analyses=analyses,
        sites=registry_side.federation.sites,
    )  # fmt: skip
    recorder.record_inventory(fed.inventory)
    return recorder.finish()


def test_the_report_names_every_analysis_of_every_task_that_left_a_site(every_release: Path):
    report, tasks = assert_every_release_named(every_release)
    assert tasks == set(TASKS.names()), sorted(set(TASKS.names()) ^ tasks)
    verdict = report.verdict.text
    assert "trained network under" not in verdict and "1 exact trained network (mlp)" in verdict
    assert "1 exact diagnostic table (heterogeneity)" in verdict
    heterogeneity = [a for a in report.analyses if a.result == "heterogeneity"]
    assert {a.sites for a in heterogeneity if len(a.sites) == 1} == {(s,) for s in SITES}


def test_an_analysis_no_result_names_is_named_in_the_verdict_with_a_warning(
    every_release: Path, tmp_path: Path
):
    """Drop the trained network's record: its training's answers left the sites all the same."""
    study = Path(shutil.copytree(every_release, tmp_path / "study"))
    (study / "releases" / "mlp.json").unlink()
    manifest = json.loads((study / "study.json").read_text())
    manifest["releases"].remove("mlp")
    (study / "study.json").write_text(json.dumps(manifest))
    report = build_report(Study.load(study))
    (training,) = [a for a in report.analyses if "deep.train" in a.tasks]
    assert training.result is None and training.answered > 0
    assert f"WARNING: answers to {training.analysis} (" in report.verdict.text
    assert "deep.train" in report.verdict.text
    with pytest.raises(AssertionError, match="tied to no result"):
        assert_every_release_named(study)
