"""Start-up stays light: importing the reports and a command's help load no accountant.

``dp_accounting`` imports its PLD accountant, and with it SciPy's signal and
stats modules: about a second of start-up (``benchmarks/startup.py``).
``accounting`` imports it where an epsilon or a curve is computed or an event
decoded, and ``reports`` imports matplotlib, Jinja2, WeasyPrint and its report
builder where a report is built, so ``import reports``, ``fedstats report
--help`` and ``fedstats budget show --help`` load none of them. Each case runs
in a fresh interpreter on this checkout and lists what it imported; the
control cases show that the listing sees ``dp_accounting`` and
``scipy.signal`` once an epsilon is computed, and that ``fedstats budget
show`` still opens and shows a ledger from a cold start (it recomputes the
scopes with the accountants, but draws nothing). How long start-up takes is
the benchmark's business, not checked here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accounting

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTANTS = ("dp_accounting", "scipy.signal")
BUILDERS = ("matplotlib", "jinja2", "weasyprint", "reports.build", "reports.plots")
DEEP = ("torch", "opacus")
WATCHED = (*ACCOUNTANTS, *BUILDERS, *DEEP)
GAUSSIAN = '{"type": "GaussianDpEvent", "noise_multiplier": 6.0}'


def cli(*arguments: str) -> str:
    """Python that runs ``fedstats ARGUMENTS`` as the installed script does."""
    return (
        f"import sys\nsys.argv = ['fedstats', *{list(arguments)!r}]\n"
        "from fedstats.cli.main import app\n"
        "try:\n    app()\n"
        "except SystemExit as stop:\n    assert stop.code in (0, None), stop.code\n"
    )


def run_fresh(code: str, cwd: Path, watched: tuple[str, ...] = WATCHED) -> tuple[list[str], str]:
    """Run ``code`` in a fresh interpreter: the ``watched`` modules it imported, its output."""
    listing = f"print(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    program = f"{code}\nimport json, sys\n{listing}"
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *shown, listing = done.stdout.strip().splitlines()
    return json.loads(listing), "\n".join(shown)


@pytest.mark.parametrize(
    ("code", "printed"),
    [
        ("import reports", ""),
        ("import accounting", ""),
        (
            "from reports import budget_table, format_epsilon\n"
            "from reports.formatting import format_delta\n"
            "import reports\nassert callable(reports.write_report)",
            "",
        ),
        (cli("--help"), "budget"),
        (cli("report", "--help"), "--study"),
        (cli("budget", "show", "--help"), "--ledger"),
        (cli("budget", "set", "--help"), "--epsilon"),
    ],
    ids=[
        "import reports",
        "import accounting",
        "the budget command's imports",
        "fedstats --help",
        "fedstats report --help",
        "fedstats budget show --help",
        "fedstats budget set --help",
    ],
)
def test_reports_and_help_import_no_accountant_and_no_report_builder(
    code: str, printed: str, tmp_path: Path
) -> None:
    imported, shown = run_fresh(code, tmp_path)
    assert imported == [], f"imported {imported}"
    assert printed in shown


def test_the_listing_sees_the_accountants_once_an_epsilon_is_computed(tmp_path: Path) -> None:
    imported, _ = run_fresh(
        "import accounting\n"
        f"event = accounting.event_from_json({GAUSSIAN!r})\n"
        "assert accounting.rdp_epsilon(event, 1e-5) > 0",
        tmp_path,
    )
    assert set(ACCOUNTANTS) <= set(imported)
    assert not set(imported) & {*BUILDERS, *DEEP}


def test_budget_show_reads_a_ledger_from_a_cold_start_without_building_a_report(
    tmp_path: Path,
) -> None:
    """The accountants load when the ledger is opened (every scope is recomputed), the figures
    equal the ledger's own, and no figure or template library is imported."""
    path = tmp_path / "site.ledger"
    scope = accounting.Scope(unit="patient", owner="site_a", study="startup")
    with accounting.Ledger(path) as ledger:
        ledger.set_budget(scope, epsilon=3.0, delta=1e-5)
        for _ in range(3):
            ledger.charge(scope, accounting.event_from_json(GAUSSIAN), task="startup.sum")
        spent = ledger.spent(scope)
    imported, shown = run_fresh(cli("budget", "show", "--ledger", str(path), "--json"), tmp_path)
    (row,) = json.loads(shown)["scopes"]
    assert (row["owner"], row["entries"]) == ("site_a", 3)
    assert row["epsilon_rdp"] == spent.epsilon and row["epsilon_pld"] == spent.epsilon_pld
    assert set(ACCOUNTANTS) <= set(imported)
    assert not set(imported) & {*BUILDERS, *DEEP}


SITE_WORKER_SPARES = (*ACCOUNTANTS, "sklearn", "scipy.stats", "sqlalchemy", *BUILDERS, *DEEP)
"""What a site's long-lived Flower worker does not load to start: the accountant (a site
that releases nothing private never needs it), scikit-learn with SciPy's stats (the first
classifier evaluation loads them), Flower's SuperNode state database, the report builders
and torch. Each is over a quarter of a second of every site process's start-up."""


def test_the_site_worker_starts_without_accountant_scikit_learn_or_supernode_state(
    tmp_path: Path,
) -> None:
    imported, _ = run_fresh(
        "import fedstats.flower_apps.site_worker", tmp_path, watched=SITE_WORKER_SPARES
    )
    assert imported == [], f"imported {imported}"


def test_the_site_worker_listing_sees_what_a_private_release_and_an_evaluation_load(
    tmp_path: Path,
) -> None:
    """The control: the same listing sees the accountant once a private release is described
    and scikit-learn once a classifier's scores are summed."""
    imported, _ = run_fresh(
        "import numpy as np\n"
        "import fedstats.flower_apps.site_worker\n"
        "from fedstats.site.private_release import release_event\n"
        "from fedstats.site.handlers.classifier_scores import binary_scores\n"
        "release_event([2.0, 3.0])\n"
        "binary_scores(np.array([-1.0, 0.5, 2.0]), np.array([0.0, 1.0, 1.0]), 1)",
        tmp_path,
        watched=SITE_WORKER_SPARES,
    )
    assert {"dp_accounting", "sklearn", "scipy.stats"} <= set(imported)
