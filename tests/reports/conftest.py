"""A small demonstration study, recorded and rendered once per test session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedstats.jobs.demo import run_demo_study
from reports import build_report, write_html, write_pdf
from reports.study import Study
from tests.flower.flower_study import SITES, TERMS

NOISE_SEED = 20260101
"""Tests fix the privacy noise (the report must then say so); production runs never do."""


@pytest.fixture(scope="session")
def demo_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demonstration study at 0.4 of its size (at a quarter, every site's exact fit holds a
    cross-cell of 1-2 deaths with a diagnosis or statin use, which its rules refuse)."""
    return run_demo_study(tmp_path_factory.mktemp("demo"), scale=0.4, noise_seed=NOISE_SEED)


@pytest.fixture(scope="session")
def rendered(demo_study: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo study's report as HTML and PDF."""
    folder = tmp_path_factory.mktemp("rendered")
    report = build_report(Study.load(demo_study))
    return {
        "html": write_html(report, folder / "report.html"),
        "pdf": write_pdf(report, folder / "report.pdf"),
    }


@pytest.fixture
def study_copy(demo_study: Path, tmp_path: Path) -> Path:
    """A copy of the demo study that a test may change."""
    return Path(shutil.copytree(demo_study, tmp_path / "study"))


FLOWER_FITS = f"""
[[fits]]
kind = "logistic"
name = "event_logistic"
formula = "event ~ {TERMS}"

[[fits]]
kind = "kaplan_meier"
name = "survival"
time = "time"
event = "event"
width = 365
horizon = 3650
sparse_events = "defer"
"""


@pytest.fixture(scope="session")
def flower_like_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study directory as ``fedstats study run`` records it after a Flower run.

    The same recording code (:func:`fedstats.jobs.study_record.record_study`)
    on the same study.toml and TCGA-BRCA sites as tests/flower, with the fits
    made in process instead of over a SuperLink (the records are identical,
    tests/flower checks that): no ledger (site ledgers stay at the sites), a
    logistic fit, Kaplan-Meier curves, the message inventory.
    """
    from fedstats import Federation, datasets
    from fedstats.flower.local_study import write_study
    from fedstats.jobs.study_config import load_study_config
    from fedstats.jobs.study_fits import run_fits
    from fedstats.jobs.study_record import record_study

    root = tmp_path_factory.mktemp("flower-like")
    frames = {s: f for s, f in datasets.tcga_brca().frames.items() if s in SITES}
    study_toml = write_study(root, SITES, FLOWER_FITS, out=root / "out")
    config = load_study_config(study_toml)
    federation = Federation.in_process(frames)
    results = run_fits(config, federation)
    status = {
        "run_id": 1,
        "nodes": {site: str(index) for index, site in enumerate(SITES)},
        "site_protocols": dict(federation.site_protocols),
        "site_paths": sorted(federation.path_sites or ()),
    }
    return record_study(config, study_toml, status, results, federation.inventory)


@pytest.fixture(scope="session")
def rendered_flower_like(
    flower_like_study: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The Flower-like study's report as HTML and PDF."""
    folder = tmp_path_factory.mktemp("rendered-flower")
    report = build_report(Study.load(flower_like_study))
    return {
        "html": write_html(report, folder / "report.html"),
        "pdf": write_pdf(report, folder / "report.pdf"),
    }
