"""The wheel is the product: built from this checkout, installed into a fresh virtual
environment and run from a folder outside the checkout, its commands work with nothing
but what the wheel carries (packaged datasets, demo specification and protocol).

Installing every dependency from the package index would take minutes, so the fresh
environment gets only the wheel (``pip install --no-deps``) and a ``.pth`` file that
appends this interpreter's site-packages as a plain path. The editable installation's own
``.pth`` there is then not executed, so the checkout is not importable: the tests check
that every project package is imported from the fresh environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import accounting
from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson

pytestmark = pytest.mark.xdist_group("packaging")  # one wheel and one environment per run

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("fedstats", "harmonize", "accounting", "reports", "studyfiles")
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "demo-output",
)
PACKAGE_DATA = [
    "fedstats/data/heart_disease/README.md",
    "fedstats/data/heart_disease/processed.cleveland.data",
    "fedstats/data/heart_disease/processed.hungarian.data",
    "fedstats/data/heart_disease/processed.switzerland.data",
    "fedstats/data/heart_disease/processed.va.data",
    "fedstats/data/tcga_brca/README.md",
    "fedstats/data/tcga_brca/brca.csv",
    "fedstats/data/tcga_brca/centers.csv",
    "fedstats/data/tcga_brca/train_test_split.csv",
    "fedstats/examples/demo/study.toml",
    "fedstats/examples/demo/protocol.toml",
    "fedstats/examples/flower/site.toml",
    "fedstats/examples/flower/study.toml",
    "fedstats/examples/flower/app/pyproject.toml",
    "fedstats/examples/flower/app/fedstats_study_app.py",
    "harmonize/data/units.toml",
    "harmonize/data/vocabulary.csv",
]


def _run(command: list[str | Path], **options) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, check=False, **options
    )
    if result.returncode != 0:
        output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        raise AssertionError(f"{command} exited {result.returncode}\n{output}")
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout (the build writes nothing into it)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = work / "dist"
    if importlib.util.find_spec("build") is not None:
        command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out]
    else:
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        command += ["--disable-pip-version-check", "--quiet", "-w", out]
    _run([*command, source])
    (built,) = out.glob("fedstats-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel; returns its ``bin`` folder."""
    venv = tmp_path_factory.mktemp("env") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    _run([*pip, "install", "--no-deps", "--no-index", "--quiet", wheel])
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    site_packages = Path(purelib.stdout.strip())
    dependencies = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site_packages / "zz_dependencies.pth").write_text("\n".join(dependencies) + "\n")
    return venv / "bin"


@pytest.fixture
def outside(tmp_path: Path) -> dict:
    """Options for a command run in a temporary folder, away from the checkout and any
    shared data folder."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "FEDSTATS_DATA"}
    }
    env["MPLBACKEND"] = "Agg"
    work = tmp_path / "work"
    work.mkdir()
    return {"cwd": work, "env": env}


def test_wheel_carries_the_datasets_licences_and_the_demo_study(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    assert not any(name.startswith(("tests/", "benchmarks/", "notebooks/")) for name in names)


def test_the_fresh_environment_imports_the_installed_packages(installed: Path, outside: dict):
    code = f"import {', '.join(PROJECT_PACKAGES)}; " + "; ".join(
        f"print({name}.__file__)" for name in PROJECT_PACKAGES
    )
    files = _run([installed / "python", "-c", code], **outside).stdout.split()
    venv = installed.parent.resolve()
    assert len(files) == len(PROJECT_PACKAGES)
    for file in files:
        assert Path(file).resolve().is_relative_to(venv), file
        assert not Path(file).resolve().is_relative_to(ROOT), file


def test_version_is_the_wheels(installed: Path, wheel: Path, outside: dict):
    version = wheel.name.split("-")[1]
    result = _run([installed / "fedstats", "--version"], **outside)
    assert result.stdout == f"fedstats {version}\n"


def test_demo_runs_from_the_installed_package(installed: Path, outside: dict, tmp_path: Path):
    out = tmp_path / "demo-output"
    result = _run([installed / "fedstats", "demo", "--out-dir", out], **outside)
    packaged = installed.parent.resolve()
    read_from = next(line for line in result.stdout.splitlines() if line.startswith("(read from "))
    folder = Path(read_from.removeprefix("(read from ").removesuffix(")"))
    assert folder.name == "heart_disease" and folder.resolve().is_relative_to(packaged)
    assert "Federated vs pooled statsmodels GLM Binomial" in result.stdout
    assert "A private study from raw extracts" in result.stdout
    assert (out / "compliance-report.html").stat().st_size > 0
    assert (out / "compliance-report.pdf").stat().st_size > 0
    assert (out / "study" / "study.json").is_file()


def test_harmonize_runs_from_the_installed_package(installed: Path, outside: dict, tmp_path: Path):
    spec = _run(
        [
            installed / "python",
            "-c",
            "from importlib.resources import files; "
            "print(files('fedstats') / 'examples' / 'demo' / 'study.toml')",
        ],
        **outside,
    ).stdout.strip()
    assert Path(spec).resolve().is_relative_to(installed.parent.resolve())
    fhir = write_fhir_ndjson(synthetic_ehr(200, seed=3), tmp_path / "fhir")
    out = tmp_path / "harmonized"
    command = [installed / "fedstats", "harmonize", "--spec", spec, "--site", "north"]
    _run([*command, "--fhir", fhir, "--out", out], **outside)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["site"] == "north"
    assert (out / "frame.parquet").stat().st_size > 0


def test_budget_show_runs_from_the_installed_package(
    installed: Path, outside: dict, tmp_path: Path
):
    import dp_accounting

    path = tmp_path / "site_a.ledger"
    with accounting.Ledger(path) as ledger:
        scope = accounting.Scope(unit="patient", owner="site_a", study="s1")
        ledger.set_budget(scope, epsilon=3.0, delta=1e-6)
        ledger.charge(scope, dp_accounting.GaussianDpEvent(5.0), note="round 1")
        spent = ledger.spent(scope).epsilon
    command = [installed / "fedstats", "budget", "show", "--ledger", path, "--json"]
    result = _run(command, **outside)
    (row,) = json.loads(result.stdout)["scopes"]
    assert row["owner"] == "site_a" and row["entries"] == 1
    assert row["epsilon_rdp"] == pytest.approx(spent, rel=1e-12)


def test_budget_set_then_show_from_the_installed_package(installed: Path, outside: dict, tmp_path):
    """A privacy officer's two commands round trip through the installed console script."""
    path = tmp_path / "site_b.ledger"
    scope = ["--study", "s2", "--unit", "patient", "--owner", "site_b"]
    set_budget = [installed / "fedstats", "budget", "set", "--ledger", path, *scope]
    _run([*set_budget, "--epsilon", "2.5", "--delta", "1e-6"], **outside)
    show = _run([installed / "fedstats", "budget", "show", "--ledger", path, "--json"], **outside)
    (row,) = json.loads(show.stdout)["scopes"]
    assert (row["study"], row["owner"], row["unit"]) == ("s2", "site_b", "patient")
    assert row["budget_epsilon"] == 2.5 and row["delta"] == 1e-6 and row["entries"] == 0
    with accounting.Ledger(path) as ledger:  # the library reads what the command wrote
        (budget,) = ledger.scopes()
        assert budget.owner == "site_b"
