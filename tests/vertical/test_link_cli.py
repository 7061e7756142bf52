"""``fedstats link check`` (a site's data engineer) and ``fedstats link run`` (the coordinator).

``link check`` is compared with the identifier table the site job kept (its missing counts,
read from the file) and with the fingerprint :mod:`linkage` computes for the study's
``[linkage]`` table; its output holds no identifier value. ``link run``'s exit codes are
those of ``fedstats study run``; its linkage over Flower is in
``tests/vertical/test_vertical_study_flower.py``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
import typer
from typer.testing import CliRunner

import linkage
from fedstats.flower import processes
from fedstats.jobs.exit_codes import SiteExit, StudyExit
from fedstats.jobs.job_lock import JobLock
from fedstats.jobs.site_batch import LOCK_FILE
from fedstats.jobs.site_linkage import CURRENT_IDENTIFIERS
from fedstats.jobs.study_links import linkage_lines
from tests.vertical.test_fhir_omop_linked import STUDY_LINKAGE
from tests.vertical.vertical_study import VerticalStudy, make_study, study_toml


def invoke(*args: str):
    from fedstats.cli.link import link_app

    app = typer.Typer()
    app.add_typer(link_app, name="link")
    return CliRunner().invoke(app, ["link", *args])


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> VerticalStudy:
    return make_study(tmp_path_factory.mktemp("linkcli"), n=200, seed=8)


def test_link_check_prints_patients_missing_counts_and_the_schema_fingerprint_never_a_value(
    study: VerticalStudy,
) -> None:
    for site in ("registry", "hospital"):
        first = invoke("check", "--config", str(study.site_tomls[site]))
        assert first.exit_code == 0, first.output
        table = pd.read_parquet(study.root / site / "work" / CURRENT_IDENTIFIERS)
        assert f"patients to encode: {len(table)}" in first.output
        for column in table.columns:
            assert f"missing {column}: {int((table[column] == '').sum())}" in first.output
        fingerprint = linkage.parse_linkage_table(STUDY_LINKAGE).fingerprint()
        assert f"linkage schema fingerprint: {fingerprint}" in first.output
        assert "(frame harmonised)" in first.output
        values = {v for c in table.columns for v in table[c] if len(v) > 3}
        assert not {v for v in values if v in first.output}
        again = invoke("check", "--config", str(study.site_tomls[site]))
        assert "(frame reused)" in again.output and again.exit_code == 0


def test_link_check_exit_codes(study: VerticalStudy, tmp_path: Path) -> None:
    """2 for a site that takes part in no linkage or a broken file, 7 while a run holds the
    lock, 3 when harmonisation fails."""
    site = study.site_tomls["hospital"]
    lock = JobLock(study.root / "hospital" / "work" / LOCK_FILE).acquire()
    try:
        held = invoke("check", "--config", str(site))
    finally:
        lock.release()
    assert held.exit_code == SiteExit.ALREADY_RUNNING == 7, held.output
    frame = pd.DataFrame({"y": [0, 1] * 10})
    frame.to_parquet(tmp_path / "frame.parquet")
    config = {
        "site": {"name": "plain", "workdir": str(tmp_path / "work")},
        "data": {"frame": str(tmp_path / "frame.parquet")},
        "privacy": {"ledger": str(tmp_path / "site.ledger")},
        "disclosure": {"verified_paths": False},
    }
    (tmp_path / "plain.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
    plain = invoke("check", "--config", str(tmp_path / "plain.toml"))
    assert plain.exit_code == SiteExit.CONFIGURATION == 2, plain.output
    assert "takes part in no record linkage" in plain.output
    broken = invoke("check", "--config", str(tmp_path / "missing.toml"))
    assert broken.exit_code == 2 and "missing.toml" in broken.output
    bad = study.site_tomls["registry"].read_text().replace("omop = ", "omop_x = ")
    (tmp_path / "bad.toml").write_text(bad, encoding="utf-8")
    assert invoke("check", "--config", str(tmp_path / "bad.toml")).exit_code == 2
    empty = study.site_tomls["registry"].read_text()
    (tmp_path / "empty-omop").mkdir()
    empty = empty.replace(str(study.root / "registry" / "omop"), str(tmp_path / "empty-omop"))
    empty = empty.replace(str(study.root / "registry" / "work"), str(tmp_path / "work-empty"))
    (tmp_path / "empty.toml").write_text(empty, encoding="utf-8")
    failed = invoke("check", "--config", str(tmp_path / "empty.toml"))
    assert failed.exit_code == SiteExit.HARMONISATION == 3, failed.output


def test_link_run_exit_codes(study: VerticalStudy, tmp_path: Path) -> None:
    """2 for a study without [[links]] or without [coordinator]; 5 for a closed port."""
    port = processes.free_port()
    coordinator = {"superlink": f"127.0.0.1:{port}", "insecure": True, "run_timeout": 0.5}
    path = study_toml(study, tmp_path / "out", coordinator=coordinator)
    closed = invoke("run", "--config", str(path))
    assert closed.exit_code == StudyExit.SUPERLINK_UNREACHABLE == 5, closed.output
    assert f"127.0.0.1:{port}" in closed.output
    no_links = tomllib.loads(path.read_text())
    no_links.pop("links")
    no_links["fits"] = [{"kind": "logistic", "name": "plain", "formula": "died ~ age"}]
    (tmp_path / "nolinks.toml").write_text(tomli_w.dumps(no_links), encoding="utf-8")
    result = invoke("run", "--config", str(tmp_path / "nolinks.toml"))
    assert result.exit_code == StudyExit.CONFIGURATION == 2, result.output
    assert "field 'links'" in result.output
    no_coordinator = study_toml(study, tmp_path / "out2")
    result = invoke("run", "--config", str(no_coordinator))
    assert result.exit_code == 2 and "'coordinator'" in result.output, result.output


def test_linkage_lines_show_suppressed_counts_as_below_k() -> None:
    record = {
        "k": 10,
        "pairs": None,
        "sites": [
            {"site": "registry", "role": "outcome", "records_sent": 40, "linked": None},
            {"site": "hospital", "role": "covariates", "records_sent": 12, "linked": None},
        ],
    }
    (line,) = linkage_lines({"L1": record})
    assert line == (
        "L1: < 10 pairs; registry (outcome): 40 records sent, < 10 linked; "
        "hospital (covariates): 12 records sent, < 10 linked"
    )
