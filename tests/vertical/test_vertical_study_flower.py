"""A vertical study over Flower: two ``fedstats site run`` jobs harmonising their own FHIR and
OMOP exports, then the coordinator's ``fedstats link run`` and ``fedstats study run``.

On loopback: a SuperLink, each site's batch job (its SuperNode and long-lived worker as
separate processes, its silo built from site.toml with the identifier table it kept), and
the two commands through typer's CliRunner. ``link run`` records the linkage; ``study run``
finds it recorded, links nothing again (the sites still hold the linkage they accepted),
makes the vertical fit and writes the study directory and compliance report. The fit equals
the embedded runtime's (``tests/vertical/test_vertical_study_jobs.py``, itself equal to
statsmodels on the truly joined rows) through the same oracle here: statsmodels GLM Binomial
on the rows joined by the generator's identity, <= 1e-6.
"""

from __future__ import annotations

import json
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
import typer
from typer.testing import CliRunner

from fedstats.cli.jobs import study_app
from fedstats.cli.link import link_app
from fedstats.flower import processes
from fedstats.jobs.site_batch import SiteExit, run_site_job
from fedstats.jobs.site_service import CURRENT_FRAME
from fedstats.jobs.study_run import StudyExit
from reports.study import Study
from tests.vertical.joined_oracle import assert_equals_joined_fit
from tests.vertical.vertical_study import FORMULA, SITES, make_study, study_toml


def invoke(*args: str):
    app = typer.Typer()
    app.add_typer(study_app, name="study")
    app.add_typer(link_app, name="link")
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def superlink(tmp_path: Path):
    with processes.running_superlink(tmp_path / "link") as address:
        yield address


def test_link_run_then_study_run_over_flower_site_jobs(superlink: str, tmp_path: Path) -> None:
    study = make_study(tmp_path / "sites")
    for path in study.site_tomls.values():
        config = tomllib.loads(path.read_text(encoding="utf-8"))
        config["coordinator"] = {
            "superlink": superlink,
            "insecure": True,
            "node_port": processes.free_port(),
            "idle_timeout": 20.0,
            "serve_timeout": 240.0,
        }
        path.write_text(tomli_w.dumps(config), encoding="utf-8")
    out = tmp_path / "coordinator" / "out"
    coordinator = {"superlink": superlink, "insecure": True, "run_timeout": 200.0}
    policy = {"round_timeout": 60.0, "discovery_timeout": 90.0, "poll_interval": 0.005}
    path = study_toml(study, out, coordinator=coordinator, policy=policy)
    with ThreadPoolExecutor(len(SITES)) as pool:
        jobs = {site: pool.submit(run_site_job, study.site_tomls[site]) for site in SITES}
        linked = invoke("link", "run", "--config", str(path))
        ran = invoke("study", "run", "--config", str(path))
        site_runs = {site: job.result(timeout=300) for site, job in jobs.items()}
    assert linked.exit_code == StudyExit.OK, linked.output
    assert ran.exit_code == StudyExit.OK, ran.output
    for site, run in site_runs.items():
        assert run.exit_code == SiteExit.OK, (site, run.reason)
        assert run.record["served"]["tasks"]["linkage.encode"]["count"] == 1  # linked once
    registry = pd.read_parquet(study.root / "registry" / "work" / CURRENT_FRAME)
    hospital = pd.read_parquet(study.root / "hospital" / "work" / CURRENT_FRAME)
    truth = study.truth(registry, hospital)
    assert f"registry-hospital: {len(truth)} pairs" in linked.output
    record = json.loads((out / "linkages" / "registry-hospital.json").read_text())
    assert record["pairs"] == len(truth)

    fit = json.loads((out / "results" / "died_vertical.json").read_text())
    assert_equals_joined_fit(fit, hospital, registry, truth, FORMULA, "over Flower")
    recorded = Study.load(out / "study")
    assert [r.linkage_id for r in recorded.linkages] == ["registry-hospital"]
    assert [f.name for f in recorded.fits] == ["died_vertical"]
