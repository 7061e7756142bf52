"""A vertical study run as every other study: site batch jobs and the coordinator's study.toml.

Each site's job harmonises its own export (the hospital FHIR, the registry OMOP) under the
study specification with a ``[linkage]`` table and keeps its identifier table beside the
frame; its silo is built from ``site.toml`` alone (:class:`fedstats.jobs.site_service.SiteService`).
The coordinator's ``study.toml`` names one ``[[links]]`` entry and one ``vertical_logistic``
fit, made by :func:`fedstats.jobs.study_fits.run_fits` (the embedded runtime of ``fedstats
study run``) over the two services. Oracle: statsmodels GLM Binomial (``fit(tol=1e-12)``) on
the rows joined by the generator's true identity.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
from pathlib import Path

import pandas as pd
import pytest

import fedstats
from fedstats.jobs.site_batch import SiteExit, run_site_job
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_linkage import CURRENT_IDENTIFIERS
from fedstats.jobs.site_service import CURRENT_FRAME, SiteService
from fedstats.jobs.site_serving import ServeResult
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits
from fedstats.jobs.study_links import linkage_path, study_linkage_table
from fedstats.jobs.study_record import record_and_report
from reports.study import Study
from tests.vertical.joined_oracle import assert_equals_joined_fit
from tests.vertical.vertical_study import (
    FORMULA,
    SITES,
    STUDY,
    VerticalStudy,
    make_study,
    study_toml,
)


def no_request(config, path, journal) -> ServeResult:
    return ServeResult("no request", 0.0, [])


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> VerticalStudy:
    made = make_study(tmp_path_factory.mktemp("vertical"))
    for site in SITES:
        run = run_site_job(made.site_tomls[site], serve=no_request)
        assert run.exit_code == SiteExit.OK, run.reason
    return made


def services(study: VerticalStudy) -> dict[str, SiteService]:
    return {site: SiteService(load_site_config(study.site_tomls[site])) for site in SITES}


def federation_of(running: dict[str, SiteService]) -> fedstats.Federation:
    return fedstats.Federation({s: service.answer for s, service in running.items()}, study=STUDY)


def identifier_values(study: VerticalStudy) -> set[str]:
    """Every name and postal code of both sites' identifier tables (longer than 3 letters)."""
    values: set[str] = set()
    for site in SITES:
        table = pd.read_parquet(study.root / site / "work" / CURRENT_IDENTIFIERS)
        for column in ("given_name", "family_name", "postal_code"):
            values |= {v for v in table[column] if len(v) > 3}
    return values


def test_a_site_job_keeps_its_identifier_table_beside_the_frame_readable_by_the_site_only(
    study: VerticalStudy,
) -> None:
    """workdir/current/identifiers.parquet: one row per frame patient, file mode 0600; the
    run record names its path and holds no value of it."""
    for site in SITES:
        work = study.root / site / "work"
        table = pd.read_parquet(work / CURRENT_IDENTIFIERS)
        frame = pd.read_parquet(work / CURRENT_FRAME)
        assert sorted(table.index) == sorted(frame.index)
        assert stat.S_IMODE(os.stat(work / CURRENT_IDENTIFIERS).st_mode) == 0o600
        (record,) = sorted((work / "runs").glob("*.json"))
        text = record.read_text(encoding="utf-8")
        assert json.loads(text)["frame"]["identifiers"] == str(work / CURRENT_IDENTIFIERS)
        leaked = {v for v in identifier_values(study) if v in text}
        assert not leaked, leaked


def test_a_second_run_reuses_frame_and_identifiers_and_a_changed_source_harmonises_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reused while sources and table are unchanged; harmonised again (table rewritten, 0600)
    when the table or a source changed; no identifier value in any log line or run record."""
    caplog.set_level(logging.DEBUG)
    made = make_study(tmp_path, n=160, seed=5)
    path = made.site_tomls["hospital"]
    work = tmp_path / "hospital" / "work"
    first = run_site_job(path, serve=no_request)
    assert first.record["frame"]["origin"] == "harmonised", first.reason
    kept = (work / CURRENT_IDENTIFIERS).read_bytes()
    second = run_site_job(path, serve=no_request)
    assert second.record["frame"]["origin"] == "reused" and "nothing new" in second.reason
    # a changed identifier table is not reused: harmonised again, the table written anew
    (work / CURRENT_IDENTIFIERS).write_bytes(b"not the table")
    third = run_site_job(path, serve=no_request)
    assert third.record["frame"]["origin"] == "harmonised"
    assert (work / CURRENT_IDENTIFIERS).read_bytes() == kept
    # a changed source: harmonised again, and the table follows the new frame
    patients = next((tmp_path / "hospital" / "fhir").rglob("Patient*.ndjson"))
    lines = patients.read_text(encoding="utf-8").splitlines()
    patients.write_text("\n".join(lines[:-5]) + "\n", encoding="utf-8")
    fourth = run_site_job(path, serve=no_request)
    assert fourth.record["frame"]["origin"] == "harmonised", fourth.reason
    table = pd.read_parquet(work / CURRENT_IDENTIFIERS)
    assert sorted(table.index) == sorted(pd.read_parquet(work / CURRENT_FRAME).index)
    assert 0 < len(table) < len(pd.read_parquet(io.BytesIO(kept)))
    assert stat.S_IMODE(os.stat(work / CURRENT_IDENTIFIERS).st_mode) == 0o600
    values = {v for column in table.columns for v in table[column] if len(v) > 3}
    written = caplog.text + "".join(p.read_text() for p in (work / "runs").glob("*.json"))
    assert len(values) > 10 and not {v for v in values if v in written}


def test_the_study_links_then_fits_equal_to_statsmodels_on_the_truly_joined_rows(
    study: VerticalStudy, tmp_path: Path
) -> None:
    """study.toml [[links]] + a vertical_logistic fit through run_fits on the sites' own
    services: the linkage record is written, the fit equals statsmodels GLM Binomial on the
    rows joined by true identity (params and bse <= 1e-6); a second run links nothing again
    and refits nothing."""
    out = tmp_path / "out"
    config = load_study_config(study_toml(study, out))
    running = services(study)
    try:
        linked: list[str] = []
        federation = federation_of(running)
        results = run_fits(config, federation, on_link=lambda i, r: linked.append(i))
        recorded = record_and_report(
            config, out.parent / f"{out.name}-study.toml", {"run_id": 0}, results,
            federation.inventory,
        )  # fmt: skip
    finally:
        for service in running.values():
            service.close()
    assert linked == ["registry-hospital"]
    record = json.loads(linkage_path(out, "registry-hospital").read_text(encoding="utf-8"))
    assert {s["site"]: s["role"] for s in record["sites"]} == {
        "registry": "outcome",
        "hospital": "covariates",
    }
    registry = pd.read_parquet(study.root / "registry" / "work" / CURRENT_FRAME)
    hospital = pd.read_parquet(study.root / "hospital" / "work" / CURRENT_FRAME)
    truth = study.truth(registry, hospital)
    assert record["pairs"] == len(truth) >= 80
    fit = results["died_vertical"]
    assert fit["kind"] == "vertical_logistic"
    assert_equals_joined_fit(fit, hospital, registry, truth, FORMULA, "vertical study")

    # the compliance report lists the linkage and the fit
    directory = Study.load(recorded.study_dir)
    assert [r.linkage_id for r in directory.linkages] == ["registry-hospital"]
    assert [f.name for f in directory.fits] == ["died_vertical"]
    html = recorded.html.read_text(encoding="utf-8")
    assert "registry-hospital" in html and "died_vertical" in html
    assert not {v for v in identifier_values(study) if v in html}

    # resume: the recorded linkage and fit are read back, nothing asked of the sites
    asked: list[bytes] = []
    again = run_fits(
        config,
        fedstats.Federation({s: asked.append for s in SITES}, study=STUDY),
        on_link=lambda i, r: linked.append(i),
    )
    assert asked == [] and linked == ["registry-hospital"]
    assert again["died_vertical"] == fit

    # sites restarted since the linkage read it back from their working folders (mode
    # 0600, named by the id's hash, no identifier value): the fit is made again, the same
    (out / "results" / "died_vertical.json").unlink()
    for site in SITES:
        kept = list((study.root / site / "work" / "linkages").glob("*.json"))
        assert len(kept) == 1 and stat.S_IMODE(kept[0].stat().st_mode) == 0o600
        assert not {v for v in identifier_values(study) if v in kept[0].read_text()}
    restarted = services(study)
    try:
        refit = run_fits(config, federation_of(restarted), on_link=lambda i, r: linked.append(i))
        # nor does a restarted site encode an accepted linkage's id again, under new keys
        with pytest.raises(fedstats.SiteError, match="already accepted linkage"):
            fedstats.link(
                federation_of(restarted), first="registry", second="hospital",
                linkage_id="registry-hospital", schema=study_linkage_table(config),
            )  # fmt: skip
    finally:
        for service in restarted.values():
            service.close()
    assert linked == ["registry-hospital"]  # not linked again
    for name, value in fit["params"].items():  # the refit, column by column
        assert abs(refit["died_vertical"]["params"][name] - value) <= 1e-12, name
