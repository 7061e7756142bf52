"""Start-up time: ``import fedstats``, ``import reports`` and the CLI, each in a fresh process,
beside ``import statsmodels.api`` measured in the same run.

Each command runs ``--repeats`` times (default 5), interleaved with the
others so that a busy moment of the machine falls on all of them alike; the
median wall time of each is reported, with its ratio to the median of
``import statsmodels.api``. Measured: ``import fedstats``; the first use of
the statistical API (``from fedstats import LogisticRegression, Federation,
Silo``, which imports NumPy, pandas, SciPy, formulaic and dp-accounting);
``import reports``; ``fedstats --help``; ``fedstats report --help``;
``fedstats budget show --help``; and ``fedstats budget show`` on a small
ledger (two scopes, five charges) written beforehand in a temporary folder.

Each command but the reference and ``fedstats --help`` (which runs the
installed script; ``fedstats_help_no_deep`` runs the same app in Python) ends
by writing which of torch, Opacus, ``scipy.signal`` and ``dp_accounting`` it
imported to stderr, and asserts what it must not have imported: none imports
torch or Opacus (deep models are the ``deep`` extra, imported on first use),
and ``import reports``, ``fedstats report --help`` and ``fedstats budget show
--help`` import neither ``dp_accounting`` nor ``scipy.signal`` (dp-accounting
loads its PLD accountant, and with it SciPy's signal and stats modules, about
a second). A real ``fedstats budget show`` opens the ledger, which recomputes
every scope's RDP curve from its entries, and shows each scope's PLD epsilon:
both are dp-accounting's accountants, so it imports them; the JSON line says
so (``fedstats_budget_show_scipy_signal_imported``). Prints one JSON line.

    .venv/bin/python benchmarks/startup.py [--repeats 5]

Targets: ``import fedstats`` and ``import reports`` under 1.0 s, ``fedstats
--help`` under 1.5 s, ``fedstats report --help`` and ``fedstats budget show
--help`` under 1.0 s; no torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable
FEDSTATS = shutil.which("fedstats", path=str(Path(PYTHON).parent)) or "fedstats"
WATCHED = ("torch", "opacus", "scipy.signal", "dp_accounting")
"""Modules each probed command reports as imported or not."""
DEEP = ("torch", "opacus")
LIGHT = (*DEEP, "scipy.signal", "dp_accounting")
"""What a command that only imports the reports or shows help must not import."""
MARK = "STARTUP-IMPORTED "
TARGETS = {
    "import_fedstats": 1.0,
    "import_reports": 1.0,
    "fedstats_help": 1.5,
    "fedstats_report_help": 1.0,
    "fedstats_budget_show_help": 1.0,
}


def probe(forbidden: tuple[str, ...]) -> str:
    """Python run at the end of a child: report :data:`WATCHED` on stderr, assert ``forbidden``."""
    return (
        "import json, sys\n"
        f"imported = [m for m in {WATCHED!r} if m in sys.modules]\n"
        f"sys.stderr.write({MARK!r} + json.dumps(imported) + '\\n')\n"
        f"assert not set(imported) & set({forbidden!r}), f'imported {{imported}}'\n"
    )


def python(code: str, forbidden: tuple[str, ...]) -> list[str]:
    return [PYTHON, "-c", f"{code}\n{probe(forbidden)}"]


def cli(arguments: list[str], forbidden: tuple[str, ...]) -> list[str]:
    """``fedstats ARGUMENTS`` run as the installed script runs it, then :func:`probe`."""
    code = (
        f"import sys\nsys.argv = ['fedstats', *{arguments!r}]\n"
        "from fedstats.cli.main import app\n"
        "try:\n    app()\nexcept SystemExit as stop:\n"
        "    if stop.code not in (0, None):\n        raise\n"
    )
    return python(code, forbidden)


def commands(ledger: Path) -> dict[str, list[str]]:
    """The timed commands; ``fedstats budget show`` reads ``ledger``."""
    return {
        "statsmodels_api": [PYTHON, "-c", "import statsmodels.api"],
        "import_fedstats": python("import fedstats", DEEP),
        "fedstats_models": python(
            "from fedstats import LogisticRegression, Federation, Silo", DEEP
        ),
        "import_reports": python("import reports", LIGHT),
        "fedstats_help": [FEDSTATS, "--help"],
        "fedstats_help_no_deep": cli(["--help"], LIGHT),
        "fedstats_report_help": cli(["report", "--help"], LIGHT),
        "fedstats_budget_show_help": cli(["budget", "show", "--help"], LIGHT),
        "fedstats_budget_show": cli(["budget", "show", "--ledger", str(ledger)], DEEP),
    }


def small_ledger(path: Path) -> Path:
    """A site's scope with three Gaussian releases and a coordinator's with two DP-SGD epochs."""
    import dp_accounting

    import accounting

    site = accounting.Scope(unit="patient", owner="site_a", study="startup")
    federation = accounting.Scope(unit="site", owner="coordinator", study="startup")
    sgd = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 100
    )
    with accounting.Ledger(path) as ledger:
        ledger.set_budget(site, epsilon=3.0, delta=1e-5)
        ledger.set_budget(federation, epsilon=8.0, delta=1e-3)
        for _ in range(3):
            ledger.charge(site, dp_accounting.GaussianDpEvent(6.0), task="startup.sum")
        for _ in range(2):
            ledger.charge(federation, sgd, task="startup.epoch")
    return path


def run(command: list[str]) -> tuple[float, list[str] | None]:
    """Seconds from start to exit of ``command`` (it must succeed) and what it reported."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr[-2000:]}")
    reports = [line for line in done.stderr.splitlines() if line.startswith(MARK)]
    return seconds, json.loads(reports[-1].removeprefix(MARK)) if reports else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    with tempfile.TemporaryDirectory() as folder:
        timed = commands(small_ledger(Path(folder) / "startup.ledger"))
        imported: dict[str, set[str]] = {}
        for name, command in timed.items():  # warm the file cache once, untimed
            _, seen = run(command)
            if seen is not None:
                imported[name] = set(seen)
        times: dict[str, list[float]] = {name: [] for name in timed}
        for _ in range(repeats):
            for name, command in timed.items():
                seconds, seen = run(command)
                times[name].append(seconds)
                if seen is not None:
                    imported[name] |= set(seen)
    median = {name: statistics.median(values) for name, values in times.items()}
    reference = median["statsmodels_api"]
    out: dict[str, object] = {"benchmark": "startup", "repeats": repeats}
    for name, seconds in median.items():
        out[f"{name}_s"] = round(seconds, 3)
        if name != "statsmodels_api":
            out[f"{name}_vs_statsmodels"] = round(seconds / reference, 3)
    out["torch_imported"] = False  # every probed command asserted it (or failed above)
    for name, seen in imported.items():
        out[f"{name}_scipy_signal_imported"] = "scipy.signal" in seen
        out[f"{name}_dp_accounting_imported"] = "dp_accounting" in seen
    for name, limit in TARGETS.items():
        out[f"{name}_target_s"] = limit
        out[f"{name}_meets_target"] = median[name] < limit
    print(json.dumps(out))


if __name__ == "__main__":
    main()
