"""A site administrator with write access rewrites the site's privacy ledger wholesale.

The strongest rewrite the file allows: every entry deleted, each scope row reset to its
genesis head with a zero curve, and SQLite's id counter reset, so the ledger is
consistent with itself and ``Ledger.verify()`` passes. The budget would start again.
It is caught by the chain heads recorded outside the file at every release: by the
silo's ledger before its next charge (the head it verified), by the site's next batch
run (its journal and run records) and by the compliance report (the heads the
coordinator recorded from the site's replies).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w

import accounting
import fedstats
from accounting.chain import genesis_hash
from fedstats import datasets
from fedstats.contract import codec
from fedstats.contract.design import DesignSpec
from fedstats.errors import SiteLedgerIntegrityError
from fedstats.jobs.site_batch import SiteExit, run_site_job
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_journal import SiteJournal
from fedstats.jobs.site_service import SiteService
from fedstats.jobs.site_serving import ServeResult
from fedstats.site.silo import Silo
from reports import build_report
from reports.errors import StudyRecordError
from reports.recorder import StudyRecorder
from reports.render import render_html
from reports.study import Study

STUDY = "rewrite-study"
SITE = "cleveland"
PRIVACY = fedstats.RecordDP(epsilon=1.0, delta=1e-3, bounds=datasets.HEART_BOUNDS)


def model() -> fedstats.LogisticRegression:
    return fedstats.LogisticRegression(datasets.HEART_FORMULA, levels=datasets.HEART_LEVELS)


def scope(site: str) -> accounting.Scope:
    return accounting.Scope(unit="patient", owner=site, study=STUDY)


def rewrite_wholesale(path: Path) -> None:
    """Every scope back to genesis, every entry gone, the id counter reset: the ledger then
    agrees with itself."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        rows = conn.execute("SELECT id, unit, owner, study, neighbouring, rdp FROM scopes")
        for sid, unit, owner, study, neighbouring, rdp in rows.fetchall():
            genesis = genesis_hash(accounting.Scope(unit, owner, study, neighbouring))
            conn.execute("DELETE FROM entries WHERE scope_id = ?", (sid,))
            conn.execute(
                "UPDATE scopes SET rdp = ?, epsilon = 0.0, entries = 0, last_hash = ? WHERE id = ?",
                (bytes(len(rdp)), genesis, sid),
            )
        conn.execute("DELETE FROM sqlite_sequence WHERE name = 'entries'")
    with accounting.Ledger(path) as ledger:
        assert ledger.verify().ok  # the file alone shows nothing
        assert all(problems == () for problems in ledger.integrity_problems().values())


# -- through a real Silo ------------------------------------------------------------


def test_a_rewrite_under_a_serving_silo_is_refused_before_its_next_charge(tmp_path):
    """On main the second fit was answered: the budget for three fits started again."""
    frames = datasets.heart_disease().frames
    ledgers = {}
    for site in frames:
        ledgers[site] = accounting.Ledger(tmp_path / f"{site}.ledger")
        ledgers[site].set_budget(scope(site), epsilon=3.0, delta=1e-3)
    federation = fedstats.Federation.in_process(frames, study=STUDY, ledgers=ledgers)
    first = model().fit(federation, privacy=PRIVACY)
    recorded = {s.owner: (s.ledger_entries, s.ledger_head) for s in first.privacy.scopes}
    assert recorded[SITE] == (
        ledgers[SITE].heads()[0].entries,
        ledgers[SITE].heads()[0].head,
    )  # each private reply carried its site's chain head

    rewrite_wholesale(tmp_path / f"{SITE}.ledger")
    with pytest.raises(SiteLedgerIntegrityError) as refused:
        model().fit(federation, privacy=PRIVACY)
    assert refused.value.site == SITE and refused.value.study == STUDY
    assert "does not verify" in str(refused.value) and "restore" in str(refused.value)

    # a fresh process opening the rewritten file sees a consistent ledger; the recorded
    # head (from the reply) is what shows the rewrite
    entries, head = recorded[SITE]
    with accounting.Ledger(tmp_path / f"{SITE}.ledger") as ledger:
        problem = ledger.rewritten_since(accounting.ChainHead(scope(SITE), entries, head))
    assert problem is not None and "charges were removed" in problem
    for ledger in ledgers.values():
        ledger.close()


# -- through the site's batch job -----------------------------------------------------


def heart_site(folder: Path) -> Path:
    """A site.toml for one hospital's frame, with a budget for the study."""
    folder.mkdir(parents=True, exist_ok=True)
    datasets.heart_disease().frames[SITE].to_parquet(folder / "frame.parquet")
    config = {
        "site": {"name": SITE, "workdir": str(folder / "work")},
        "data": {"frame": str(folder / "frame.parquet")},
        "privacy": {"ledger": str(folder / "site.ledger")},
        "disclosure": {"min_count": 10, "verified_paths": False},  # no roster: says so
        "coordinator": {"superlink": "127.0.0.1:1", "insecure": True},
    }
    path = folder / "site.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    with accounting.Ledger(folder / "site.ledger") as ledger:
        ledger.set_budget(scope(SITE), epsilon=3.0, delta=1e-3)
    return path


def private_fit_in_process(asked: list[str]):
    """The run's serving step: a coordinator in process fitting the private model."""

    def serve(config, path, journal: SiteJournal) -> ServeResult:
        asked.append("serve")
        service = SiteService(config)
        try:
            federation = fedstats.Federation({SITE: service.answer}, study=STUDY)
            model().fit(federation, privacy=PRIVACY)
        finally:
            service.close()
        return ServeResult("idle", 0.0, [])

    return serve


def test_a_rewrite_between_runs_stops_the_next_site_run(tmp_path):
    path = heart_site(tmp_path)
    asked: list[str] = []
    first = run_site_job(path, serve=private_fit_in_process(asked))
    assert first.exit_code == SiteExit.OK, first.reason
    (after,) = first.record["ledger_heads_after"]
    assert after["entries"] == first.record["charged"]["ledger_entries_added"] > 0
    journal = SiteJournal(tmp_path / "work" / "journal.jsonl").records()
    assert journal[-1]["ledger_heads"] == first.record["ledger_heads_after"]

    rewrite_wholesale(tmp_path / "site.ledger")
    second = run_site_job(path, serve=private_fit_in_process(asked))
    assert second.exit_code == SiteExit.LEDGER_INTEGRITY == 11, second.reason
    assert asked == ["serve"]  # nothing was served in the second run
    assert "charges were removed" in second.reason and "Nothing was served" in second.reason
    assert "ledger_heads_before" not in second.record  # a rewritten head is never recorded
    # the refusal holds at the run after, until the ledger is restored
    third = run_site_job(path, serve=private_fit_in_process(asked))
    assert third.exit_code == SiteExit.LEDGER_INTEGRITY and asked == ["serve"]


def test_an_edited_curve_between_runs_stops_the_next_site_run(tmp_path):
    path = heart_site(tmp_path)
    asked: list[str] = []
    assert run_site_job(path, serve=private_fit_in_process(asked)).exit_code == SiteExit.OK
    with sqlite3.connect(tmp_path / "site.ledger", isolation_level=None) as conn:
        (blob,) = conn.execute("SELECT rdp FROM scopes").fetchone()
        conn.execute("UPDATE scopes SET rdp = ?, epsilon = 0.0", (bytes(len(blob)),))
    run = run_site_job(path, serve=private_fit_in_process(asked))
    assert run.exit_code == SiteExit.LEDGER_INTEGRITY, run.reason
    assert "RDP curve" in run.reason and asked == ["serve"]


# -- through the compliance report ------------------------------------------------------


def recorded_study(folder: Path) -> Path:
    """A study whose sites' ledgers live in its directory (the embedded runtime)."""
    frames = datasets.heart_disease().frames
    recorder = StudyRecorder(folder, study=STUDY)
    spec = folder.parent / "spec.toml"
    spec.write_text('[study]\nname = "rewrite-study"\n', encoding="utf-8")
    recorder.record_spec(spec)
    recorder.record_configuration({"study": STUDY, "noise_seed": None})
    ledgers = {}
    for site in frames:
        ledgers[site] = recorder.ledger(site)
        ledgers[site].set_budget(scope(site), epsilon=3.0, delta=1e-3)
    federation = fedstats.Federation.in_process(frames, study=STUDY, ledgers=ledgers)
    result = model().fit(federation, privacy=PRIVACY)
    recorder.record_fit("private", result, description="private logistic regression")
    return recorder.finish()


def test_the_report_says_on_page_one_when_a_ledger_was_rewritten(tmp_path):
    study = recorded_study(tmp_path / "study")
    honest = build_report(Study.load(study))
    assert {h.owner: h.state for h in honest.ledger_heads} == {
        site: "extends" for site in datasets.heart_disease().frames
    }
    assert "rewritten" not in honest.verdict.text

    rewrite_wholesale(study / "ledgers" / f"{SITE}.ledger")
    report = build_report(Study.load(study))
    assert all(ledger.ok for ledger in report.ledgers)  # the file alone shows nothing
    states = {h.owner: h.state for h in report.ledger_heads}
    assert states.pop(SITE) == "rewritten" and set(states.values()) == {"extends"}
    assert f"the privacy ledger of {SITE} was rewritten after it released" in report.verdict.text
    html = render_html(report)
    page_one = html[: html.index('id="verdict"') + 2000]
    assert "was rewritten after it released" in page_one
    assert "REWRITTEN" in html


def test_the_report_refuses_an_edited_record_of_heads(tmp_path):
    study = recorded_study(tmp_path / "study")
    heads = study / "ledger-heads.json"
    records = json.loads(heads.read_text())
    records[0]["entries"] = 0
    heads.write_text(json.dumps(records))
    with pytest.raises(StudyRecordError, match=r"ledger-heads\.json"):
        Study.load(study)


def test_a_rewrite_between_two_requests_is_refused_by_the_next_service(tmp_path):
    """A Flower ClientApp may build a new SiteService for each message, so the ledger object
    that verified the first charge is gone when the next request arrives. The new service
    opens a rewritten ledger that agrees with itself; it must compare it with the heads the
    journal recorded. On main the second fit was answered: the budget started again."""
    path = heart_site(tmp_path)
    config = load_site_config(path)
    first = SiteService(config)
    try:
        model().fit(fedstats.Federation({SITE: first.answer}, study=STUDY), privacy=PRIVACY)
    finally:
        first.close()
    journal = SiteJournal(tmp_path / "work" / "journal.jsonl")
    answered = len(journal.records())

    rewrite_wholesale(tmp_path / "site.ledger")
    second = SiteService(config)
    try:
        with pytest.raises(SiteLedgerIntegrityError) as refused:
            model().fit(fedstats.Federation({SITE: second.answer}, study=STUDY), privacy=PRIVACY)
    finally:
        second.close()
    assert refused.value.site == SITE and refused.value.study == STUDY
    lines = [r for r in journal.records()[answered:] if r.get("event") == "answered"]
    assert not any(r["private"] for r in lines)  # no private reply left the site
    assert lines[-1]["status"] == "error"
    assert lines[-1]["error_type"] == "SiteLedgerIntegrityError"
    with accounting.Ledger(tmp_path / "site.ledger") as ledger:
        assert ledger.heads()[0].entries == 0  # nothing was charged to the rewritten ledger


@pytest.mark.parametrize("kept", ["journal", "runs"])
def test_a_rewrite_is_caught_while_either_record_of_heads_survives(tmp_path, kept):
    """The README: a rewrite cannot be hidden while the journal *or* the last run record
    survives. The administrator rewrites the ledger and deletes the other record."""
    path = heart_site(tmp_path)
    asked: list[str] = []
    assert run_site_job(path, serve=private_fit_in_process(asked)).exit_code == SiteExit.OK
    rewrite_wholesale(tmp_path / "site.ledger")
    work = tmp_path / "work"
    if kept == "journal":
        for record in (work / "runs").glob("*.json"):
            record.unlink()
    else:
        (work / "journal.jsonl").unlink()
    run = run_site_job(path, serve=private_fit_in_process(asked))
    assert run.exit_code == SiteExit.LEDGER_INTEGRITY, run.reason
    assert "charges were removed" in run.reason and asked == ["serve"]


def test_another_sites_valid_ledger_in_place_of_the_sites_own_stops_the_next_run(tmp_path):
    """The administrator swaps in a ledger that verifies on its own, but is another site's
    (its scopes charged for the same study under another owner)."""
    path = heart_site(tmp_path)
    asked: list[str] = []
    assert run_site_job(path, serve=private_fit_in_process(asked)).exit_code == SiteExit.OK
    other = tmp_path / "other.ledger"
    with accounting.Ledger(other) as ledger:
        ledger.set_budget(scope("hungary"), epsilon=3.0, delta=1e-3)
        federation = fedstats.Federation.in_process(
            {"hungary": datasets.heart_disease().frames["hungary"]},
            study=STUDY,
            ledgers={"hungary": ledger},
        )
        model().fit(federation, privacy=PRIVACY)
        assert ledger.verify().ok
    other.replace(tmp_path / "site.ledger")
    run = run_site_job(path, serve=private_fit_in_process(asked))
    assert run.exit_code == SiteExit.LEDGER_INTEGRITY, run.reason
    assert f"owner={SITE}" in run.reason and "is missing" in run.reason
    assert asked == ["serve"]


def test_an_unreadable_head_in_the_journal_leaves_the_service_charging_nothing(tmp_path):
    """The administrator rewrites the ledger and spoils the heads of the journal's last line,
    so they cannot be compared: the service refuses every private request rather than
    trusting a ledger it could not check."""
    path = heart_site(tmp_path)
    config = load_site_config(path)
    first = SiteService(config)
    try:
        model().fit(fedstats.Federation({SITE: first.answer}, study=STUDY), privacy=PRIVACY)
    finally:
        first.close()
    rewrite_wholesale(tmp_path / "site.ledger")
    journal = SiteJournal(tmp_path / "work" / "journal.jsonl")
    journal.append({"event": "answered", "seq": 0, "ledger_heads": "spoilt"})
    second = SiteService(config)
    try:
        with pytest.raises(SiteLedgerIntegrityError):
            model().fit(fedstats.Federation({SITE: second.answer}, study=STUDY), privacy=PRIVACY)
    finally:
        second.close()


# -- the heads travel site -> coordinator ----------------------------------------------


@pytest.mark.parametrize("where", ["args", "dp"])
def test_a_coordinator_cannot_set_the_head_a_private_reply_carries(tmp_path, where):
    """A request carrying its own dp_ledger_head / dp_ledger_entries (beside the arguments,
    or inside its dp block) is answered with the ledger's own head, or refused: the head the
    coordinator records is never one it chose."""
    rng = np.random.default_rng(0)
    data = pd.DataFrame({"age": rng.integers(30, 80, 80).astype(float)})
    data["disease"] = (rng.random(80) < 0.4).astype(int)
    ledger = accounting.Ledger(tmp_path / "s.ledger")
    ledger.set_budget(accounting.Scope("patient", "s", STUDY), epsilon=1e4, delta=1e-5)
    silo = Silo("s", data, ledger=ledger, noise_seed=0)
    wire = DesignSpec(
        outcome_kind="binary",
        formula="disease ~ age",
        outcome="disease",
        variables=("disease", "age"),
        levels={},
        columns=("Intercept", "age"),
        site_intercepts=False,
        sites=("s",),
    ).to_wire()
    forged = {"dp_ledger_head": "f" * 64, "dp_ledger_entries": 0}
    dp = {"noise_multipliers": {"gradient": 5.0, "hessian": 5.0}, "study": STUDY}
    args = {
        "design": wire,
        "beta": np.zeros(2),
        "clip": {"row_norm": 2.0, "scaling": np.tile([0.0, 100.0], (2, 1))},
        "dp": {**dp, "analysis": "probe", "note": "", **(forged if where == "dp" else {})},
        **(forged if where == "args" else {}),
    }
    reply = codec.decode(silo.handle(codec.encode({"task": "logistic.summaries", "args": args})))
    (head,) = ledger.heads()
    if where == "args":  # unknown arguments are not read; the site's facts are its own
        result = reply["result"]
        assert (result["dp_ledger_entries"], result["dp_ledger_head"]) == (1, head.head)
        assert head.entries == 1 and head.head != "f" * 64
    else:  # the dp block admits its four fields only
        assert reply["error"]["type"] == "MalformedRequestError" and head.entries == 0
    ledger.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("dp_ledger_head", "not a hash"), ("dp_ledger_entries", -1), ("dp_ledger_entries", np.nan)],
)
def test_a_site_sending_a_malformed_head_spoils_neither_the_fit_nor_the_study_record(
    tmp_path, field, value
):
    """A registered site answers with a head the study record cannot hold. Before, the fit
    failed on a count that is not a number, and otherwise the coordinator wrote the head into
    ledger-heads.json, which Study.load then refused: no report for any site."""
    folder = tmp_path / "study"
    frames = datasets.heart_disease().frames
    recorder = StudyRecorder(folder, study=STUDY)
    spec = tmp_path / "spec.toml"
    spec.write_text('[study]\nname = "rewrite-study"\n', encoding="utf-8")
    recorder.record_spec(spec)
    recorder.record_configuration({"study": STUDY, "noise_seed": None})
    handlers = {}
    for site, data in frames.items():
        ledger = recorder.ledger(site)
        ledger.set_budget(scope(site), epsilon=3.0, delta=1e-3)
        handlers[site] = Silo(site, data, ledger=ledger).handle
    honest = handlers[SITE]

    def forging(request: bytes) -> bytes:
        reply = codec.decode(honest(request))
        if reply["status"] == "ok" and field in reply["result"]:
            reply["result"][field] = value
        return codec.encode(reply)

    handlers[SITE] = forging
    result = model().fit(fedstats.Federation(handlers, study=STUDY), privacy=PRIVACY)
    (forged,) = [s for s in result.privacy.scopes if s.owner == SITE]
    assert (forged.ledger_entries, forged.ledger_head) == (None, None)
    recorder.record_fit("private", result, description="private logistic regression")
    report = build_report(Study.load(recorder.finish()))
    assert {h.owner: h.state for h in report.ledger_heads} == {
        site: "extends" for site in frames if site != SITE
    }
