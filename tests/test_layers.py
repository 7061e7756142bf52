"""The layer contracts (``[tool.importlinter]`` in pyproject.toml) hold, and catch a wrong import.

``lint-imports`` runs on a scratch copy of the five packages: the copy as it
is keeps every contract; the same copy with one deliberately wrong import —
the silo boundary importing a coordinator model or the reverse, a deep site
task importing the coordinator, the deep trainer importing a site handler, the
operations layer importing a Flower app, ``reports`` importing ``fedstats``,
``accounting`` importing ``harmonize``, a model importing the CLI — breaks the
contract that forbids it, and the report names the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedstats", "harmonize", "accounting", "reports", "studyfiles", "linkage")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
LAYERS = (
    "fedstats layers: commands > Flower apps > operations > transport > in-process runtime > "
    "deep halves > the two sides > contract > shared"
)
SIDES = "the coordinator (fedstats.models) and the site (fedstats.site) never import each other"
SITE_SIDE = "the site's side, deep tasks included, imports no coordinator code"
COORDINATOR_SIDE = "the coordinator's side, deep training included, imports no site code"


def scratch_copy(folder: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    return folder


def lint_imports(folder: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(folder))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scratch_copy(tmp_path_factory.mktemp("layers"))


def test_the_code_keeps_every_contract(scratch: Path) -> None:
    done = lint_imports(scratch)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout
    assert f"{LAYERS} KEPT" in " ".join(done.stdout.split())


@pytest.mark.parametrize(
    ("module", "line", "contract", "shown"),
    [
        (
            "fedstats/site/scratch_wrong.py",
            "from fedstats.models import logistic\n",
            LAYERS,
            "fedstats.site.scratch_wrong -> fedstats.models.logistic",
        ),
        (
            "fedstats/models/scratch_wrong.py",
            "from fedstats.site import silo\n",
            SIDES,
            "fedstats.models.scratch_wrong -> fedstats.site.silo",
        ),
        (
            "fedstats/deep/site/scratch_wrong.py",
            "from fedstats.models import federation\n",
            SITE_SIDE,
            "fedstats.deep.site.scratch_wrong -> fedstats.models.federation",
        ),
        (
            "fedstats/deep/training/scratch_wrong.py",
            "from fedstats.site.handlers import design\n",
            COORDINATOR_SIDE,
            "fedstats.deep.training.scratch_wrong -> fedstats.site.handlers.design",
        ),
        (
            "fedstats/jobs/scratch_wrong.py",
            "from fedstats.flower_apps import site_app\n",
            LAYERS,
            "fedstats.jobs.scratch_wrong -> fedstats.flower_apps.site_app",
        ),
        (
            "fedstats/contract/scratch_wrong.py",
            "from fedstats.site import silo\n",
            LAYERS,
            "fedstats.contract.scratch_wrong -> fedstats.site.silo",
        ),
        (
            "reports/scratch_wrong.py",
            "import fedstats.models.results\n",
            "reports reads the study directory and ledgers, never fedstats",
            "reports.scratch_wrong -> fedstats.models.results",
        ),
        (
            "accounting/scratch_wrong.py",
            "import harmonize.spec\n",
            "accounting, harmonize, studyfiles and linkage stand alone",
            "accounting.scratch_wrong -> harmonize.spec",
        ),
        (
            "linkage/scratch_wrong.py",
            "import harmonize.spec\n",
            "accounting, harmonize, studyfiles and linkage stand alone",
            "linkage.scratch_wrong -> harmonize.spec",
        ),
        (
            "harmonize/scratch_wrong.py",
            "import linkage.schema\n",
            "accounting, harmonize, studyfiles and linkage stand alone",
            "harmonize.scratch_wrong -> linkage.schema",
        ),
        (
            "linkage/scratch_wrong.py",
            "import fedstats.errors\n",
            "accounting, harmonize, studyfiles and linkage import no other project package",
            "linkage.scratch_wrong -> fedstats.errors",
        ),
        (
            "fedstats/models/scratch_wrong.py",
            "from fedstats.cli import main\n",
            LAYERS,
            "fedstats.models.scratch_wrong -> fedstats.cli.main",
        ),
        (
            "fedstats/site/scratch_wrong.py",
            "import reports.build\n",
            "only the operations layer (fedstats.jobs) and the commands import reports",
            "fedstats.site.scratch_wrong -> reports.build",
        ),
    ],
)
def test_a_wrong_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str, shown: str
) -> None:
    folder = scratch_copy(tmp_path)
    (folder / module).write_text(f'"""A deliberately wrong import."""\n\n{line}')
    done = lint_imports(folder)
    assert done.returncode != 0
    assert f"{contract} BROKEN" in " ".join(done.stdout.split()), done.stdout[-3000:]
    assert shown in done.stdout, done.stdout[-3000:]
