"""``fedstats study run``: a study over Flower, recorded and reported, and its exit codes.

End to end on loopback: a SuperLink, three sites each served by its own
``fedstats site run`` job (each starting its SuperNode and site worker as
separate processes), and the coordinator's ``study run``. The fits equal the
embedded runtime's (``Federation.in_process`` on the same frames) to 1e-10,
the study directory loads and the compliance report is written; every
process started is stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
import typer
from typer.testing import CliRunner

from fedstats import Federation, datasets
from fedstats.cli.jobs import study_app
from fedstats.flower import processes
from fedstats.jobs.site_batch import SiteExit, run_site_job
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits
from fedstats.jobs.study_run import StudyExit
from reports.study import Study
from tests.reports.release_checks import assert_every_release_named

SITES = ["region_0", "region_1", "region_2"]
COVARIATES = "age_at_index + ajcc_pathologic_n_n1 + prior_malignancy_yes"
FITS = [
    {"kind": "logistic", "name": "event_logistic", "formula": f"event ~ {COVARIATES}"},
    {"kind": "kaplan_meier", "name": "survival", "time": "time", "event": "event",
     "width": 365.0, "horizon": 3650.0, "sparse_events": "defer"},
    {"kind": "deep", "name": "event_mlp", "model": "mlp", "formula": f"event ~ {COVARIATES}",
     "algorithm": "fedavg", "rounds": 2, "local_steps": 2, "lr": 0.1, "batch_size": 32,
     "hyper": {"hidden": [8]}, "bounds": {"age_at_index": [20, 95], "ajcc_pathologic_n_n1": [0, 1],
                                          "prior_malignancy_yes": [0, 1]}},
]  # fmt: skip


def study_toml(
    folder: Path, superlink: str, *, sites=SITES, run_timeout=200.0, discovery=60.0
) -> Path:
    """A study.toml with an insecure [coordinator] section."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "study": {"name": "flower-study", "sites": list(sites), "out": str(folder / "out")},
        "coordinator": {"superlink": superlink, "insecure": True, "run_timeout": run_timeout},
        "policy": {"round_timeout": 60.0, "discovery_timeout": discovery, "poll_interval": 0.005},
        "fits": FITS,
    }
    path = folder / "study.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path


def site_toml(folder: Path, name: str, superlink: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    datasets.tcga_brca().frames[name].to_parquet(folder / "frame.parquet")
    config = {
        "site": {"name": name, "workdir": str(folder / "work")},
        "data": {"frame": str(folder / "frame.parquet")},
        "privacy": {"ledger": str(folder / "site.ledger")},
        "disclosure": {"verified_paths": False},  # no roster: the site says it does not verify
        "coordinator": {
            "superlink": superlink,
            "insecure": True,
            "node_port": processes.free_port(),
            "idle_timeout": 15.0,
            "serve_timeout": 200.0,
        },
    }
    path = folder / "site.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path


def invoke(path: Path):
    app = typer.Typer()
    app.add_typer(study_app, name="study")
    return CliRunner().invoke(app, ["study", "run", "--config", str(path)])


@pytest.fixture(scope="module")
def superlink(tmp_path_factory: pytest.TempPathFactory):
    with processes.running_superlink(tmp_path_factory.mktemp("link") / "link") as address:
        yield address  # running_superlink raises if the SuperLink outlives its stop


def test_study_run_over_three_site_jobs_equals_the_embedded_runtime(
    superlink: str, tmp_path: Path
) -> None:
    """Logistic regression (Flower vs in-process, |diff| <= 1e-10), Kaplan–Meier and a trained
    network, recorded and reported; the report names every analysis that left a site. (Every
    model kind's equality is in test_flower_equality/test_flower_models.)"""
    configs = {site: site_toml(tmp_path / site, site, superlink) for site in SITES}
    with ThreadPoolExecutor(len(SITES)) as pool:
        jobs = {site: pool.submit(run_site_job, path) for site, path in configs.items()}
        study = study_toml(tmp_path / "coordinator", superlink)
        result = invoke(study)
        site_runs = {site: job.result(timeout=120) for site, job in jobs.items()}
    assert result.exit_code == StudyExit.OK, result.output
    out = tmp_path / "coordinator" / "out"
    assert (out / "compliance-report.html").is_file()
    assert str(out / "compliance-report.html") in result.output

    config = load_study_config(study)
    embedded = run_fits(
        config.model_copy(update={"study": config.study.model_copy(update={"out": tmp_path})}),
        Federation.in_process({s: datasets.tcga_brca().frames[s] for s in SITES}),
    )
    recorded = Study.load(out / "study")
    assert [fit.name for fit in recorded.fits] == ["event_logistic"]
    (curve,) = recorded.curves  # the Kaplan-Meier fit is recorded as curves, not a table
    assert curve.name == "survival" and "survival" not in recorded.diagnostics
    assert curve.result.grid == embedded["survival"]["grid"]
    assert np.allclose(
        np.array(curve.result.survival["all"], dtype=float),
        np.array(embedded["survival"]["survival"]["all"], dtype=float),
        rtol=0,
        atol=1e-10,
        equal_nan=True,
    )
    for fit in recorded.fits:
        reference = embedded[fit.name]
        assert list(fit.result.params) == list(reference["params"])
        for key in ("params", "bse"):
            a = np.array(list(getattr(fit.result, key).values()))
            b = np.array(list(reference[key].values()))
            assert np.max(np.abs(a - b)) <= 1e-10, (fit.name, key, a - b)
        assert abs(fit.result.llf - reference["llf"]) <= 1e-10
    assert recorded.inventory is not None
    assert recorded.ledgers == ()  # site ledgers stay at the sites; the configuration says so
    assert "stay at the sites" in recorded.configuration["ledgers"]
    html = (out / "compliance-report.html").read_text()
    assert "event_logistic" in html and "region_2" in html
    # the curve never claims certainty it lacks: S = 1 with a zero-width interval only where
    # the pooled data have no death yet; where a site's counts stop, "not released", naming it
    pooled = pd.concat([datasets.tcga_brca().frames[s] for s in SITES])
    record = curve.result
    for i, t in enumerate(record.grid):
        s, low, high = (record.survival["all"][i], record.lower["all"][i], record.upper["all"][i])
        if s == 1 and low == high:
            assert not ((pooled["time"] <= t) & (pooled["event"] == 1)).any(), t
    cut = [w for w in record.horizon_warnings if "safe horizon" in w]
    assert cut and "not released" in html  # on these sites a horizon ends the yearly curve
    assert all(re.search(r"region_\d at \d+", w) for w in cut), cut
    (network,) = recorded.releases  # the trained network: named, shown, tied to its messages
    assert network.name == "event_mlp" and network.kind == "trained network"
    report, tasks = assert_every_release_named(out / "study")
    assert {"deep.train", "deep.evaluate", "survival.counts", "logistic.summaries"} <= tasks
    assert "1 exact trained network (event_mlp)" in report.verdict.text

    for site, run in site_runs.items():
        assert run.exit_code == SiteExit.OK, (site, run.reason)
        assert run.record["served"]["tasks"]["harmonize.fingerprint"]["count"] == 1
        for pid in run.record["serving"]["processes"]:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    served = sum(run.record["served"]["count"] for run in site_runs.values())
    status = json.loads((out / "status.json").read_text())
    assert served == status["messages"] == len(recorded.inventory)


def test_a_site_that_never_answers_exits_site_lost_naming_it(
    superlink: str, tmp_path: Path
) -> None:
    study = study_toml(tmp_path, superlink, sites=["region_9"], discovery=2.0)
    result = invoke(study)
    assert result.exit_code == StudyExit.SITE_LOST == 9, result.output
    assert "region_9" in result.output


def test_no_status_within_run_timeout_exits_run_failed(superlink: str, tmp_path: Path) -> None:
    study = study_toml(tmp_path, superlink, sites=["region_8"], run_timeout=0.5, discovery=2.0)
    result = invoke(study)
    assert result.exit_code == StudyExit.RUN_FAILED == 10, result.output
    assert "run_timeout" in result.output


def test_a_closed_superlink_port_exits_superlink_unreachable(tmp_path: Path) -> None:
    port = processes.free_port()
    result = invoke(study_toml(tmp_path, f"127.0.0.1:{port}", run_timeout=0.5))
    assert result.exit_code == StudyExit.SUPERLINK_UNREACHABLE == 5, result.output
    assert f"127.0.0.1:{port}" in result.output


def test_a_broken_study_toml_exits_configuration_error_naming_the_field(tmp_path: Path) -> None:
    path = study_toml(tmp_path, "127.0.0.1:1")
    path.write_text(path.read_text().replace("run_timeout = 200.0", 'run_timeout = "soon"'))
    result = invoke(path)
    assert result.exit_code == StudyExit.CONFIGURATION == 2
    assert "coordinator.run_timeout" in result.output
    text = path.read_text()
    path.write_text(text[: text.index("[coordinator]")] + text[text.index("[policy]") :])
    result = invoke(path)
    assert result.exit_code == StudyExit.CONFIGURATION and "'coordinator'" in result.output
