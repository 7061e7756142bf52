"""The benchmarks keep running: every script imports, and the sized ones run at a tiny size.

A benchmark is run by hand (each prints one JSON line of ratios measured side by side), so
a refactor could break one silently. Every script under ``benchmarks/`` is imported here
(module-level settings, such as a disclosure policy, are built on import), and each script
that takes a size runs end to end at a tiny one and prints its JSON line. The targets are
the scripts' own business at their default sizes, not checked here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py"))

TINY = {
    "glm.py": ["--n", "3000", "--sites", "2", "--covariates", "3"],
    "linkage.py": ["--febrl-rows", "300", "--scale", "300", "--workers", "1"],
    "logistic.py": ["--n", "3000", "--sites", "2", "--covariates", "3"],
    "cox.py": ["--n", "3000", "--sites", "2", "--covariates", "3"],
    "flower.py": ["--sites", "2", "--idle-seconds", "1"],
    "flower_simulation.py": ["--sites", "3", "--per-site", "60", "--covariates", "3"],
    "secagg.py": [
        "--length",
        "200",
        "--repeats",
        "1",
        "--fit-sites",
        "10",
        "--covariates",
        "2",
        "--rows",
        "100",
    ],
    "startup.py": ["--repeats", "1"],
    "vertical.py": ["--n", "200", "--covariates", "2"],
    "verified_paths.py": ["--sites", "2", "--n", "300", "--covariates", "2", "--repeats", "1"],
}
"""The scripts run end to end here, with arguments that make them take seconds."""


def test_every_benchmark_is_listed():
    assert {p.name for p in SCRIPTS} >= set(TINY)
    assert len(SCRIPTS) >= 15


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_imports(script: Path):
    """Importing runs the module's top level (its settings) but not its ``main``."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)  # a script may put the repository or its own folder on the path
    sys.path.insert(0, str(BENCHMARKS))
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
        del sys.modules[spec.name]
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"


@pytest.mark.parametrize("name", sorted(TINY))
def test_sized_benchmarks_run_at_a_tiny_size_and_print_one_json_line(name: str):
    environment = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *TINY[name]],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    record = json.loads(lines[-1])
    assert isinstance(record, dict) and record, done.stdout[-500:]
