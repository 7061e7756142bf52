"""The demo study's compliance report: HTML, PDF, PNG pages, epsilons equal to the ledgers."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import dp_accounting
import pytest
from headless_chromium import load_page
from PIL import Image

import accounting
from reports import build_report, format_epsilon, render_html
from reports.study import Study


def _ledger_spending(study: Path) -> dict[str, accounting.Spent]:
    """Every scope's spending, read from the ledger files directly (not through reports)."""
    spending = {}
    for path in sorted((study / "ledgers").glob("*.ledger")):
        with accounting.Ledger(path) as ledger:
            for scope in ledger.scopes():
                spending[scope.owner] = ledger.spent(scope)
    return spending


def _pdf_text(pdf: Path, *options: str) -> str:
    return subprocess.run(
        ["pdftotext", *options, str(pdf), "-"], check=True, capture_output=True, text=True
    ).stdout


def test_pdf_pages_convert_to_png(rendered, tmp_path):
    subprocess.run(
        ["pdftoppm", "-r", "40", "-png", str(rendered["pdf"]), str(tmp_path / "page")], check=True
    )
    pages = sorted(tmp_path.glob("page-*.png"))
    assert len(pages) >= 5, pages
    for page in pages:
        with Image.open(page) as image:
            assert image.format == "PNG"
            width, height = image.size
            # A4 portrait at 40 dpi is 331 x 468; the ledger appendix is landscape
            assert min(width, height) > 250 and max(width, height) / min(width, height) > 1.4
            assert image.convert("L").getextrema()[0] < 100  # something dark is drawn


def test_pdf_text_shows_every_scopes_epsilon_as_in_the_ledger(demo_study, rendered):
    spending = _ledger_spending(demo_study)
    assert {"coordinator", "north", "south", "east", "west"} <= set(spending)
    html = rendered["html"].read_text(encoding="utf-8")
    claim = html[html.index('<h2 id="claim">') : html.index('<h2 id="unit">')]
    verdict = " ".join(_pdf_text(rendered["pdf"], "-l", "1").split())
    table = _pdf_text(rendered["pdf"], "-layout")
    for owner, spent in spending.items():
        rdp, pld = format_epsilon(spent.epsilon), format_epsilon(spent.epsilon_pld)
        budget, delta = format_epsilon(spent.budget_epsilon), f"{spent.delta:.3g}"
        claim_row = re.search(
            rf"<tr><td>{owner}</td><td>(?:record|client)-level</td>.*?"
            rf'<td class="n">{re.escape(rdp)}</td><td class="n">{re.escape(pld)}</td>'
            rf'<td class="n">{re.escape(delta)}</td><td class="n">{re.escape(budget)}</td>',
            claim,
        )
        assert claim_row, (owner, rdp, pld)
        assert f"(ε = {rdp}, δ = {delta})" in verdict and owner in verdict
        row = rf"^\s*{owner}\s+\S+\s+{budget}\s+{re.escape(delta)}\s+{rdp}\s+{pld}\s+"
        assert re.search(row, table, re.MULTILINE), (owner, rdp, pld)


def test_html_is_self_contained(rendered):
    html = rendered["html"].read_text(encoding="utf-8")
    sources = re.findall(r'(?:src|href)="([^"]*)"', html)
    external = [s for s in sources if not s.startswith(("data:", "#"))]
    assert sources and external == [], external
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_chromium_shows_the_html_without_console_errors(rendered, tmp_path):
    screenshot = tmp_path / "report.png"
    errors = load_page(rendered["html"], screenshot)
    assert errors == []
    with Image.open(screenshot) as image:
        assert image.format == "PNG" and image.size[0] >= 800
        assert len(image.convert("L").getcolors(maxcolors=100_000) or []) > 10  # not blank


def test_the_console_check_catches_a_broken_page(tmp_path):
    """The same check, on a page that logs an error and loads a missing image, fails."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><img src="missing.png"><script>console.error("boom")</script></body></html>'
    )
    errors = load_page(page, tmp_path / "broken.png")
    assert any("boom" in e for e in errors), errors
    assert any("missing.png" in e for e in errors), errors


def test_one_more_ledger_charge_changes_that_scope_and_nothing_else(study_copy):
    before = build_report(Study.load(study_copy))
    scope = accounting.Scope(unit="patient", owner="east", study=before.study)
    with accounting.Ledger(study_copy / "ledgers" / "east.ledger") as ledger:
        ledger.charge(scope, dp_accounting.GaussianDpEvent(3.0), note="an extra release")
        spent = ledger.spent(scope)
    after = build_report(Study.load(study_copy))

    changed = {s.owner: s for s in after.scopes}["east"]
    old = {s.owner: s for s in before.scopes}["east"]
    assert changed.entries == old.entries + 1 == spent.entries
    assert changed.epsilon_rdp == spent.epsilon > old.epsilon_rdp
    assert changed.epsilon_pld == spent.epsilon_pld
    assert changed.timeline[-1][1] == spent.epsilon
    assert [s for s in after.scopes if s.owner != "east"] == [
        s for s in before.scopes if s.owner != "east"
    ]
    assert len(after.ledger_entries) == len(before.ledger_entries) + 1
    assert after.fits == before.fits and after.mechanisms == before.mechanisms
    html = render_html(after)
    assert f'<td class="n">{format_epsilon(spent.epsilon)}</td>' in html
    assert f"east protected each of its patients with (ε = {format_epsilon(spent.epsilon)}," in html
    assert "an extra release" in html


def test_a_tampered_ledger_entry_shows_and_fails_verification(study_copy):
    import sqlite3

    path = study_copy / "ledgers" / "west.ledger"
    with sqlite3.connect(path) as db:
        db.execute("UPDATE entries SET epsilon_after = 0.1234 WHERE seq = 1")
    report = build_report(Study.load(study_copy))
    (integrity,) = [ledger for ledger in report.ledgers if ledger.file == "west.ledger"]
    assert not integrity.ok and integrity.problems
    west = [e for e in report.ledger_entries if e.owner == "west"]
    assert west[0].epsilon_after == 0.1234
    assert "NOT OK" in render_html(report)


def test_facts_that_were_not_recorded_are_said_to_be_absent(study_copy):
    (study_copy / "inventory.jsonl").unlink()
    html = render_html(build_report(Study.load(study_copy)))
    assert "No message inventory is recorded." in html
    assert "No empirical privacy audit is recorded." in html
    assert "not used" in html  # secure aggregation, absent from the exact and client-level fits


def test_secure_aggregation_and_the_trust_it_needs_are_reported(demo_study):
    report = build_report(Study.load(demo_study))
    (trust,) = [t for t in report.fits_trust if t.fit == "logistic-record-dp"]
    assert trust.secure_aggregation["threshold"] == 4
    assert "masked" in trust.coordinator_sees
    for scope in report.scopes:
        if scope.unit == "patient":
            # four Newton rounds under secure aggregation, the noisy counts without
            assert "4 of 5 charges released under secure aggregation" in scope.protects_against
            assert "does not collude with sites" in scope.protects_against
        else:
            assert "secure aggregation" not in scope.protects_against
            # client-level DP with few sites is said to be weak, with the recorded site count
            assert "With 4 sites in the message inventory, this guarantee is weak" in (
                scope.protects_against
            )


def test_a_recorded_audit_and_the_fixed_seed_are_reported(study_copy):
    from fedstats.models.audit import AuditResult

    audit = AuditResult(
        epsilon_lower=0.42,
        confidence=0.95,
        delta=1e-5,
        canaries=200,
        included=97,
        guesses=40,
        correct=29,
        guess_grid=(20, 40),
        accounted_epsilon=1.0,
    )
    (study_copy / "audits").mkdir()
    import json

    (study_copy / "audits" / "dp-sgd.json").write_text(json.dumps(audit.to_record()))
    report = build_report(Study.load(study_copy))
    assert [a.epsilon_lower for a in report.audits] == [0.42]
    html = render_html(report)
    assert "Steinke, Nasr" in html and format_epsilon(0.42) in html
    assert "FIXED SEED" in html  # the test fixture fixed the noise seed


@pytest.mark.parametrize("owner", ["north", "coordinator"])
def test_mechanisms_as_run_match_the_ledger_events(demo_study, owner):
    report = build_report(Study.load(demo_study))
    scopes = [s for m in report.mechanisms for s in m.scopes if s.owner == owner]
    assert scopes and all(s.agree and s.ledger_entries > 0 for s in scopes)


def test_each_sites_protocol_hash_and_refusals_by_reason_are_reported(study_copy):
    from fedstats.jobs.demo import PROTOCOL

    approved = hashlib.sha256(PROTOCOL.read_bytes()).hexdigest()
    report = build_report(Study.load(study_copy))
    rules = {r.site: r for r in report.site_rules}
    assert set(rules) == {"north", "south", "east", "west"}
    assert {r.protocol_sha256 for r in rules.values()} == {approved}
    assert all(r.refusals == () for r in rules.values())
    # two refusals at one site, as a site's typed error replies are recorded
    path = study_copy / "inventory.jsonl"
    last = json.loads(path.read_text().splitlines()[-1])
    extra = [
        {**last, "seq": last["seq"] + 1 + i, "site": "east", "status": "refused", "reason": why}
        for i, why in enumerate(["protocol", "cells", "protocol"])
    ]
    path.write_text(path.read_text() + "".join(json.dumps(e) + "\n" for e in extra))
    report = build_report(Study.load(study_copy))
    east = {r.site: r for r in report.site_rules}["east"]
    assert east.refusals == (("protocol", 2), ("cells", 1))
    html = render_html(report)
    shown = re.sub(r"<[^>]+>", "", html)  # a digest is printed in groups a line may break between
    assert approved in shown and "protocol: 2; cells: 1" in html


def test_each_private_result_shows_its_interval_method_noise_share_and_warnings(demo_study):
    """The demo's private fits at epsilon 1 on ~1,000 patients are noise-dominated: the
    report flags them on its first page, prints every coefficient's noise share beside its
    interval (as the fit record holds it) and the warning in words; the exact fit has
    neither."""
    study = Study.load(demo_study)
    report = build_report(study)
    html = render_html(report)
    fits = {f.name: f for f in report.fits}
    private = fits["logistic-record-dp"]
    record = study.fit("logistic-record-dp").result
    assert private.noise_dominated and private.utility_warnings == tuple(record.utility_warnings)
    assert "Ferrando" in private.interval_method
    assert {r.term: r.noise_share for r in private.rows} == record.noise_share
    alert = html[html.index('<div class="alert">') : html.index('<h2 id="claim">')]
    assert "logistic-record-dp" in alert and "logistic-exact" not in alert
    assert "noise share" in html and "privacy noise dominates" in html
    exact = fits["logistic-exact"]
    assert not exact.noise_dominated and all(r.noise_share is None for r in exact.rows)
    assert "inverse of the summed information" in exact.interval_method


def test_each_site_shows_its_schema_fingerprint_and_its_own_data_fingerprint(demo_study):
    """The schema fingerprint is the same at every site (it describes the columns); the data
    fingerprint, SHA-256 of the frame's rows, is each site's own."""
    report = build_report(Study.load(demo_study))
    sites, schemas, specs, data = zip(*report.fingerprints, strict=True)
    assert len(set(schemas)) == 1 and len(set(specs)) == 1
    assert len(set(data)) == len(sites) == 4 and all(len(d) == 64 for d in data)
    shown = re.sub(r"<[^>]+>", "", render_html(report))
    assert "data fingerprint" in shown and all(d in shown for d in data)
