"""Kaplan–Meier curves, exact and private, recorded in a study and shown in its report.

A small study (4 sites x 200 patients, exponential event times) records one
exact curve and one private curve at epsilon 0.05, where the privacy noise
(a standard deviation of about 150 in each summed count) swamps counts of
a few hundred: the report must name the private curve on its first page,
print its interval method, noise shares and warning beside its table, and
leave the exact curve out of the alert.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from markupsafe import escape

import accounting
import fedstats
from fedstats.models.kaplan_meier import GREENWOOD_LOGLOG, PRIVATE_GREENWOOD
from reports import StudyRecordError, build_report, format_epsilon, render_html, write_pdf
from reports.errors import RecordingError
from reports.formatting import format_count, format_share
from reports.recorder import StudyRecorder
from reports.study import Study
from studyfiles.errors import FitRecordError
from studyfiles.fit_records import CurveRecord

GRID = np.arange(1.0, 7.0)
SITES = [f"s{k}" for k in range(4)]
EXACT, PRIVATE = "survival-exact", "survival-dp"
NOISE_SEED = 3


def _frames(seed: int = 11, n_per_site: int = 200) -> dict[str, pd.DataFrame]:
    """Exponential event times (mean 5); each patient censored at a random grid point or never."""
    rng = np.random.default_rng(seed)
    frames = {}
    for site in SITES:
        event = rng.exponential(5.0, n_per_site)
        censor = rng.choice(np.r_[GRID, np.inf], n_per_site)
        frames[site] = pd.DataFrame({"t": np.minimum(event, censor), "e": event <= censor})
    return frames


@pytest.fixture(scope="module")
def km_study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The recorded study directory and the two fitted results."""
    root = tmp_path_factory.mktemp("km")
    spec = root / "spec.toml"
    spec.write_text('[study]\nname = "km"\ndescription = "Survival after admission"\n')
    recorder = StudyRecorder(root / "study", study="km")
    recorder.record_spec(spec)
    books = {}
    for site in SITES:
        books[site] = recorder.ledger(site)
        books[site].set_budget(
            accounting.Scope(unit="patient", owner=site, study="km"), epsilon=10.0, delta=1e-6
        )
    frames = _frames()
    exact = fedstats.KaplanMeier("t", "e", grid=GRID).fit(
        fedstats.Federation.in_process(frames, study="km")
    )
    federation = fedstats.Federation.in_process(
        frames, study="km", ledgers=books, noise_seed=NOISE_SEED
    )
    private = fedstats.KaplanMeier(
        "t", "e", grid=GRID, privacy=fedstats.RecordDP(epsilon=0.05, delta=1e-6)
    ).fit(federation)
    recorder.record_configuration({"noise_seed": NOISE_SEED, "privacy": {PRIVATE: 0.05}})
    recorder.record_curves(EXACT, exact, description="overall survival, exact counts")
    recorder.record_curves(PRIVATE, private, description="overall survival at epsilon 0.05")
    recorder.record_inventory(federation.inventory)
    return {"dir": recorder.finish(), "exact": exact, "private": private}


@pytest.fixture
def km_copy(km_study: dict, tmp_path: Path) -> Path:
    return Path(shutil.copytree(km_study["dir"], tmp_path / "study"))


def _section(html: str, name: str) -> str:
    """The HTML of one curve, from its heading to the next heading."""
    start = html.index(f"<h4>{name}:")
    ends = [i for i in (html.find("<h4>", start + 1), html.find("<h3", start)) if i > 0]
    return html[start : min(ends)]


def test_the_report_shows_each_curve_and_names_the_noise_dominated_one_first(km_study):
    exact, private = km_study["exact"], km_study["private"]
    assert private.noise_dominated and not exact.noise_dominated
    report = build_report(Study.load(km_study["dir"]))
    assert [c.name for c in report.curves] == [EXACT, PRIVATE]
    assert [c.name for c in report.curves if c.noise_dominated] == [PRIVATE]
    html = render_html(report)

    alert = html[html.index('<div class="alert">') : html.index('<h2 id="claim">')]
    assert PRIVATE in alert and EXACT not in alert
    assert "survival curve" in alert

    section = _section(html, PRIVATE)
    assert str(escape(PRIVATE_GREENWOOD)) in section
    for warning in private.utility_warnings:
        assert f"<strong>Warning:</strong> {escape(warning)}." in section
    shares = private.noise_share_["all"].dropna()
    assert len(shares) and (shares > 0.5).any()
    for share in shares:
        assert format_share(share) in section
    assert "noise share" in section and "Noise multiplier" in section
    for site, epsilon in private.counts.epsilon_spent.items():
        assert f"{site} {format_epsilon(epsilon)}" in section  # cumulative, per site
    at_risk = private.counts.at_risk[0]
    assert all(format_count(n) in section for n in at_risk)  # noisy counts, whole numbers
    assert not any(f"{n:.1f}" in section for n in at_risk if n != round(n))

    plain = _section(html, EXACT)
    assert str(escape(GREENWOOD_LOGLOG)) in plain
    assert "noise share" not in plain and "Warning" not in plain
    assert "Exact</strong> (no privacy noise)" in plain


def test_the_private_curves_facts_come_from_its_record(km_study):
    private = km_study["private"]
    (curve,) = [c for c in build_report(Study.load(km_study["dir"])).curves if c.private]
    counts = private.counts
    assert curve.noise_multiplier == counts.noise_multiplier
    assert curve.noise_sd_per_count == pytest.approx(np.sqrt(counts.noise_variance), rel=1e-15)
    assert curve.epsilon_spent == counts.epsilon_spent
    assert curve.interval_method == PRIVATE_GREENWOOD
    assert curve.utility_warnings == tuple(private.utility_warnings)
    (group,) = curve.groups
    assert [p.time for p in group.points] == list(GRID)
    assert [p.at_risk for p in group.points] == list(counts.at_risk[0])
    shares = [p.noise_share for p in group.points]
    expected = private.noise_share_["all"].to_numpy()
    assert [s is None for s in shares] == list(np.isnan(expected))
    assert [s for s in shares if s is not None] == list(expected[~np.isnan(expected)])
    # the sites reported their noise as seeded (the test fixes it): the hazards row says so
    report = build_report(Study.load(km_study["dir"]))
    assert {(s.fit, s.owner, s.fixed_seed) for s in report.seeds} == {
        (PRIVATE, site, True) for site in SITES
    }
    assert f"s0 in {PRIVATE}" in render_html(report)


def test_the_curve_record_validates_and_round_trips(km_study):
    for name, result in ((EXACT, km_study["exact"]), (PRIVATE, km_study["private"])):
        record = result.to_record()
        model = CurveRecord.model_validate_json(json.dumps(record))
        assert model.model == "KaplanMeier" and model.alpha == 0.05
        written = json.loads((km_study["dir"] / "curves" / f"{name}.json").read_text())
        assert written["result"] == record
        assert Study.load(km_study["dir"]).curve(name).result == model
    exact = km_study["exact"].to_record()
    assert exact["noise_multiplier"] is None and exact["noise_sd_per_count"] is None
    assert exact["epsilon_spent"] is None and exact["noise_share"] is None
    assert exact["secure_aggregation"] is False and sum(exact["n_obs"].values()) == 800
    private = km_study["private"].to_record()
    assert private["noise_multiplier"] > 0 and set(private["epsilon_spent"]) == set(SITES)
    manifest = json.loads((km_study["dir"] / "study.json").read_text())
    assert manifest["curves"] == [EXACT, PRIVATE]


def test_a_curve_file_missing_a_field_stops_the_study_naming_it(km_copy):
    path = km_copy / "curves" / f"{PRIVATE}.json"
    record = json.loads(path.read_text())
    del record["result"]["interval_method"]
    path.write_text(json.dumps(record))
    with pytest.raises(StudyRecordError, match=rf"{PRIVATE}\.json.*result\.interval_method"):
        Study.load(km_copy)


def test_a_curve_whose_tables_do_not_match_its_grid_is_named(km_copy):
    path = km_copy / "curves" / f"{EXACT}.json"
    record = json.loads(path.read_text())
    record["result"]["survival"]["all"].pop()
    path.write_text(json.dumps(record))
    with pytest.raises(StudyRecordError, match=r"survival\.all holds 5 values for 6 grid times"):
        Study.load(km_copy)


def test_the_writer_refuses_a_curve_the_report_could_not_read(km_study, tmp_path):
    recorder = StudyRecorder(tmp_path / "study", study="km")
    record = km_study["exact"].to_record()
    with pytest.raises(FitRecordError, match=r"not a valid curve record.*field groups"):
        recorder.record_curves("broken", {**record, "groups": "all"}, description="x")
    with pytest.raises(RecordingError, match="curve name"):
        recorder.record_curves("../escape", record, description="x")
    assert not (tmp_path / "study" / "curves").exists()


def test_a_study_recorded_before_curves_still_builds(km_copy):
    shutil.rmtree(km_copy / "curves")
    manifest = json.loads((km_copy / "study.json").read_text())
    del manifest["curves"]
    (km_copy / "study.json").write_text(json.dumps(manifest))
    report = build_report(Study.load(km_copy))
    assert report.curves == ()
    html = render_html(report)
    assert "No survival curve is recorded." in html and '<div class="alert">' not in html


def test_the_pdf_shows_the_survival_curves(km_study, tmp_path):
    pdf = write_pdf(build_report(Study.load(km_study["dir"])), tmp_path / "report.pdf")
    text = " ".join(
        subprocess.run(
            ["pdftotext", str(pdf), "-"], check=True, capture_output=True, text=True
        ).stdout.split()
    )
    assert "Survival curves" in text
    assert f"{EXACT}: overall survival, exact counts" in text
    assert f"{PRIVATE}: overall survival at epsilon 0.05" in text
    assert "noise share" in text and "parametric bootstrap of the noisy counts" in text
