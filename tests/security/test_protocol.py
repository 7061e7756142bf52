"""The protocol a site approved: exact requests outside it are refused before any row is read.

The attack: without a protocol, a coordinator chooses every model, term,
group and grid it sends; the cell rules and the differencing guard are
heuristics against what it may craft. With an approved protocol the site
answers exactly only the analyses its privacy officer approved — every
reconstruction probe of the issue is then outside it, whatever its cells.
"""

from __future__ import annotations

import contextlib
import hashlib
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.datasets import heart_disease, tcga_brca
from fedstats.errors import ProtocolError, StudyConfigurationError
from fedstats.models.agree import agreed_design
from fedstats.site.protocol import TASK_MODELS, Protocol, load_protocol
from fedstats.site.registry import REGISTRY
from fedstats.site.silo import Silo

FORMULA = "disease ~ age + C(sex) + chol"

PROTOCOL = f"""
[protocol]
title = "Heart disease risk factors"
approved_by = "Cleveland Clinic privacy office"
approved_on = 2026-11-20

[[protocol.analysis]]
name = "risk model"
model = "logistic"
formula = "{FORMULA}"
max_rounds = 40

[[protocol.analysis]]
name = "cholesterol only, private"
model = "logistic"
formula = "disease ~ chol"
privacy = "dp"
"""


@pytest.fixture(scope="module")
def heart():
    """Cleveland and Hungary: VA's two healthy women are a cross-cell of sex and disease that
    its rules refuse for the approved model."""
    return heart_disease().only(("cleveland", "hungary"))


@pytest.fixture(scope="module")
def protocol() -> Protocol:
    return Protocol.from_toml(PROTOCOL)


def federation(heart, protocol, **options) -> fedstats.Federation:
    return fedstats.Federation.in_process(
        heart.frames, protocols=dict.fromkeys(heart.frames, protocol), **options
    )


def summaries(silo: Silo, formula: str, fed: fedstats.Federation) -> dict:
    """A raw ``logistic.summaries`` request at beta = 0 for ``formula``, its design agreed on
    the same frames without a protocol and without ``prepare`` (the attacker crafts the
    request; ``prepare`` would be refused first, by the protocol or the cell rules)."""
    free = fedstats.Federation.in_process(
        {silo.name: silo._context.frame}, disclosure=fedstats.DisclosurePolicy(min_count=1)
    )
    spec, _ = agreed_design(free, formula, analysis="probe")
    args = {"design": spec.to_wire(), "beta": np.zeros(spec.n_params)}
    return codec.decode(silo.handle(codec.encode({"task": "logistic.summaries", "args": args})))


def test_the_approved_analysis_is_answered_and_equals_the_fit_without_a_protocol(heart, protocol):
    guarded = fedstats.LogisticRegression(FORMULA).fit(federation(heart, protocol))
    free = fedstats.LogisticRegression(FORMULA).fit(fedstats.Federation.in_process(heart.frames))
    np.testing.assert_allclose(guarded.params, free.params, rtol=0, atol=1e-10)
    np.testing.assert_allclose(guarded.bse, free.bse, rtol=0, atol=1e-10)


def test_a_model_with_another_term_is_refused_naming_the_term(heart, protocol):
    fed = federation(heart, protocol)
    with pytest.raises(ProtocolError) as caught:
        fedstats.LogisticRegression(FORMULA + " + trestbps").fit(fed)
    error = caught.value
    assert error.term == "trestbps"
    assert error.site in heart.frames and error.task in ("prepare", "logistic.summaries")
    assert "risk model" in error.analysis
    assert all(entry.status != "released" for entry in fed.silos["cleveland"].log[-1:])


@pytest.mark.parametrize(
    "formula",
    [
        "disease ~ I((age == 63) & (chol == 233))",  # one patient's indicator
        "disease ~ age + C(sex) + chol + I((age >= 60) | (chol == 233))",  # a set plus one
        "disease ~ age + C(sex)",  # a sub-model
        "I((age == 63) & (chol == 233)) ~ C(sex) + trestbps",  # crafted outcome
        "disease ~ age + C(sex) + log(chol)",  # a transformed term
    ],
)
def test_every_reconstruction_probe_is_outside_the_protocol(heart, protocol, formula):
    fed = federation(heart, protocol)
    silo = fed.silos["cleveland"]
    reply = summaries(silo, formula, fed)
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "ProtocolError"
    values = reply["error"]["values"]
    assert values["site"] == "cleveland" and values["task"] == "logistic.summaries"
    assert values["term"]  # the term that is outside the protocol is named
    assert silo.log[-1].status == "refused" and silo.log[-1].reason == "protocol"


def ledgers(heart, tmp_path: Path) -> dict[str, accounting.Ledger]:
    out = {}
    for site in heart.frames:
        ledger = accounting.Ledger(tmp_path / f"{site}.sqlite")
        ledger.set_budget(accounting.Scope("patient", site, "heart"), 10.0, 1e-5)
        out[site] = ledger
    return out


def charges(ledgers: dict[str, accounting.Ledger]) -> int:
    return sum(
        len(ledger.entries(accounting.Scope("patient", site, "heart")))
        for site, ledger in ledgers.items()
    )


PRIVATE = fedstats.RecordDP(epsilon=2.0, delta=1e-5, bounds={"chol": (100.0, 610.0)})


def test_a_private_only_analysis_is_refused_exactly_and_answered_privately(
    heart, protocol, tmp_path
):
    books = ledgers(heart, tmp_path)
    fed = federation(heart, protocol, ledgers=books, study="heart")
    with pytest.raises(ProtocolError, match="only with differential privacy"):
        fedstats.LogisticRegression("disease ~ chol").fit(fed)
    assert charges(books) == 0
    fit = fedstats.LogisticRegression("disease ~ chol").fit(fed, privacy=PRIVATE)
    assert np.isfinite(fit.params).all()
    assert charges(books) > 0


def test_a_private_request_outside_the_protocol_is_refused_before_any_charge(
    heart, protocol, tmp_path
):
    books = ledgers(heart, tmp_path)
    private = fedstats.RecordDP(epsilon=2.0, delta=1e-5, bounds={"trestbps": (0.0, 220.0)})
    fed = federation(heart, protocol, ledgers=books, study="heart")
    with pytest.raises(ProtocolError) as caught:
        fedstats.LogisticRegression("disease ~ trestbps").fit(fed, privacy=private)
    assert caught.value.term == "trestbps"
    assert charges(books) == 0
    # with exploration allowed, the same request is answered and charged; exactly, refused
    exploring = Protocol.from_toml(
        PROTOCOL.replace("approved_on", "dp_exploration = true\napproved_on")
    )
    fed = federation(heart, exploring, ledgers=books, study="heart")
    fit = fedstats.LogisticRegression("disease ~ trestbps").fit(fed, privacy=private)
    assert np.isfinite(fit.params).all() and charges(books) > 0
    with pytest.raises(ProtocolError):
        fedstats.LogisticRegression("disease ~ trestbps").fit(fed)


def test_the_protocols_rounds_cap_the_analysis(heart):
    capped = Protocol.from_toml(PROTOCOL.replace("max_rounds = 40", "max_rounds = 3"))
    fed = federation(heart, capped, verified_paths=False)  # raw requests at beta = 0
    silo = fed.silos["cleveland"]
    replies = [summaries(silo, FORMULA, fed) for _ in range(5)]
    assert [r["status"] for r in replies] == ["ok", "ok", "ok", "error", "error"]
    assert replies[3]["error"]["values"]["rule"] == "rounds"


def test_tasks_that_describe_no_patient_are_answered_under_any_protocol(heart, protocol):
    fed = federation(heart, protocol)
    args = {
        "variables": ["age", "sex"],
        "levels_for": ["sex"],
        "levels_known": [],
        "list_levels": True,
    }
    request = {"task": "describe", "args": args}
    reply = codec.decode(fed.silos["hungary"].handle(codec.encode(request)))
    assert reply["status"] == "ok", reply
    # the fingerprint names the protocol the site approved
    reply = codec.decode(
        fed.silos["hungary"].handle(codec.encode({"task": "harmonize.fingerprint", "args": {}}))
    )
    assert reply["result"]["protocol_sha256"] == protocol.digest


def test_every_task_about_patients_is_classified_by_the_protocol():
    about_patients = {t.name for t in REGISTRY if t.about_patients}
    extra_missing = set(REGISTRY.names()) - {t.name for t in REGISTRY}  # deep, not installed
    assert extra_missing <= {"deep.train", "deep.evaluate"}
    assert about_patients | extra_missing == set(TASK_MODELS)


# ---------------------------------------------------------------- survival grid and groups

KM_PROTOCOL = """
[protocol]
title = "Breast cancer survival"

[[protocol.analysis]]
name = "overall survival"
model = "kaplan_meier"
outcome = "Surv(time, event)"
groups = ["prior_malignancy_yes"]
time_grid = [1000, 2000, 3000]
"""


def km(silo: Silo, grid, group=None) -> dict:
    args = {"grid": np.asarray(grid, float), "time": "time", "event": "event", "group": group}
    if group is not None:
        args["levels"] = [0, 1]
    return codec.decode(silo.handle(codec.encode({"task": "survival.counts", "args": args})))


def test_the_protocol_fixes_the_survival_grid_from_the_first_request():
    frame = tcga_brca().frames["region_0"]
    silo = Silo("region_0", frame, protocol=Protocol.from_toml(KM_PROTOCOL))
    first = km(silo, [500.0, 4000.0])  # even the first request must use the approved grid
    assert first["error"]["values"]["rule"] == "grid"
    assert km(silo, [1000.0, 2000.0])["status"] == "ok"  # a prefix
    assert km(silo, [1000.0, 2000.0, 3000.0])["status"] == "ok"
    grouped = km(silo, [1000.0, 2000.0, 3000.0], group="tumor_stage_stage_i")
    assert grouped["error"]["type"] == "ProtocolError"
    assert grouped["error"]["values"]["term"] == "tumor_stage_stage_i"


# ---------------------------------------------------------------- the file and its digest


def test_a_protocol_file_edited_after_approval_is_refused(tmp_path: Path):
    path = tmp_path / "protocol.toml"
    path.write_text(PROTOCOL, encoding="utf-8")
    approved = hashlib.sha256(PROTOCOL.encode()).hexdigest()
    assert load_protocol(path, sha256=approved).digest == approved
    path.write_text(PROTOCOL.replace("max_rounds = 40", "max_rounds = 4000"), encoding="utf-8")
    with pytest.raises(StudyConfigurationError, match="changed after approval"):
        load_protocol(path, sha256=approved)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('model = "logistic"', 'model = "random_forest"'), "'model' must be one of"),
        (("max_rounds = 40", "max_rounds = 0"), "max_rounds"),
        (('privacy = "dp"', 'privacy = "maybe"'), "'privacy'"),
        (('+ chol"', '+ I(chol.__class__)"'), "risk model"),
        (("title = ", "titel = "), "unknown keys"),
    ],
)
def test_a_malformed_protocol_names_what_to_fix(change, message):
    with pytest.raises(StudyConfigurationError, match=message):
        Protocol.from_toml(PROTOCOL.replace(*change))


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=string.printable, max_size=300),
    st.sampled_from(["", "[protocol]\n", "[protocol]\ntitle = 'x'\n[[protocol.analysis]]\n"]),
)
def test_any_protocol_text_gives_a_protocol_or_a_configuration_error(text, prefix):
    with contextlib.suppress(StudyConfigurationError):
        Protocol.from_toml(prefix + text)


COX_PROTOCOL = """
[protocol]
title = "Breast cancer mortality"

[[protocol.analysis]]
name = "cox"
model = "cox"
formula = "Surv(time, event) ~ age_at_index + prior_malignancy_yes"
groups = ["ajcc_pathologic_n_n0_i"]
"""


def test_a_cox_analysis_is_answered_and_an_unapproved_cluster_is_refused():
    tcga = tcga_brca()
    frames = {s: tcga.frames[s] for s in ("region_0", "region_1")}
    approved = Protocol.from_toml(COX_PROTOCOL)
    fed = fedstats.Federation.in_process(frames, protocols=dict.fromkeys(frames, approved))
    formula = "Surv(time, event) ~ age_at_index + prior_malignancy_yes"
    guarded = fedstats.CoxPH(formula).fit(fed)
    free = fedstats.CoxPH(formula).fit(fedstats.Federation.in_process(frames))
    np.testing.assert_allclose(guarded.params, free.params, rtol=0, atol=1e-10)
    fedstats.CoxPH(formula, cluster="ajcc_pathologic_n_n0_i").fit(fed)  # an approved cluster
    with pytest.raises(ProtocolError) as caught:
        fedstats.CoxPH(formula, cluster="tumor_stage_stage_iia").fit(fed)
    assert caught.value.term == "tumor_stage_stage_iia" and caught.value.task == "cox.robust"
