"""Start-up time: ``import fedstats``, ``import reports`` and ``fedstats --help``, each in a
fresh process, beside ``import statsmodels.api`` measured in the same run.

Each command runs ``--repeats`` times (default 5), interleaved with the
others so that a busy moment of the machine falls on all of them alike; the
median wall time of each is reported, with its ratio to the median of
``import statsmodels.api``. Also measured: the first use of the statistical
API (``from fedstats import LogisticRegression, Federation, Silo``, which
imports NumPy, pandas, SciPy, formulaic and dp-accounting) and whether any of
these processes imported torch or Opacus (none may: deep models are the
``deep`` extra, imported on first use). Prints one JSON line.

    .venv/bin/python benchmarks/startup.py [--repeats 5]

Targets: ``import fedstats`` under 1.0 s and ``fedstats --help`` under 1.5 s; no torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PYTHON = sys.executable
FEDSTATS = shutil.which("fedstats", path=str(Path(PYTHON).parent)) or "fedstats"
NO_DEEP = "import sys; assert 'torch' not in sys.modules and 'opacus' not in sys.modules"

COMMANDS: dict[str, list[str]] = {
    "statsmodels_api": [PYTHON, "-c", "import statsmodels.api"],
    "import_fedstats": [PYTHON, "-c", f"import fedstats; {NO_DEEP}"],
    "fedstats_models": [
        PYTHON,
        "-c",
        f"from fedstats import LogisticRegression, Federation, Silo; {NO_DEEP}",
    ],
    "import_reports": [PYTHON, "-c", f"import reports; {NO_DEEP}"],
    "fedstats_help": [FEDSTATS, "--help"],
    "fedstats_help_no_deep": [
        PYTHON,
        "-c",
        f"import sys; sys.argv = ['fedstats', '--help']\n"
        f"from fedstats.cli.main import app\ntry:\n    app()\nexcept SystemExit:\n    pass\n"
        f"{NO_DEEP}",
    ],
}
TARGETS = {"import_fedstats": 1.0, "fedstats_help": 1.5}


def wall_time(command: list[str]) -> float:
    """Seconds from start to exit of ``command``; it must succeed."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    for command in COMMANDS.values():  # warm the file cache once, untimed
        wall_time(command)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(repeats):
        for name, command in COMMANDS.items():
            times[name].append(wall_time(command))
    median = {name: statistics.median(values) for name, values in times.items()}
    reference = median["statsmodels_api"]
    out: dict[str, object] = {"benchmark": "startup", "repeats": repeats}
    for name, seconds in median.items():
        out[f"{name}_s"] = round(seconds, 3)
        if name != "statsmodels_api":
            out[f"{name}_vs_statsmodels"] = round(seconds / reference, 3)
    out["torch_imported"] = False  # every timed command asserted it (or failed above)
    for name, limit in TARGETS.items():
        out[f"{name}_target_s"] = limit
        out[f"{name}_meets_target"] = median[name] < limit
    print(json.dumps(out))


if __name__ == "__main__":
    main()
