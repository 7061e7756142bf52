"""A small demonstration study, recorded and rendered once per test session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedstats.jobs.demo import run_demo_study
from reports import build_report, write_html, write_pdf
from reports.study import Study

NOISE_SEED = 20260101
"""Tests fix the privacy noise (the report must then say so); production runs never do."""


@pytest.fixture(scope="session")
def demo_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demonstration study at a quarter of its size (about 1,000 synthetic patients)."""
    return run_demo_study(tmp_path_factory.mktemp("demo"), scale=0.25, noise_seed=NOISE_SEED)


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
