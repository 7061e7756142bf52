"""Making a study's configured fits on any federation, and recording their results.

The same function runs in the embedded runtime and inside the Flower
ServerApp, so the two can be compared number for number. Results are
written one file per fit as each fit completes (atomically), and a fit
whose file exists is not made again: a study stopped by a lost site
resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fedstats
from fedstats.federation import Federation
from fedstats.study_config import CoxFit, Fit, KaplanMeierFit, LogisticFit, StudyConfig

RESULTS_DIR = "results"


def make_fit(fit: Fit, federation: Federation) -> dict[str, Any]:
    """Run one configured fit and return its result as plain JSON values (full precision)."""
    if isinstance(fit, LogisticFit):
        result = fedstats.LogisticRegression(fit.formula, site_intercepts=fit.site_intercepts).fit(
            federation
        )
        return {"kind": fit.kind, **result.to_record()}
    if isinstance(fit, CoxFit):
        result = fedstats.CoxPH(fit.formula, strata=fit.strata, ties=fit.ties).fit(federation)
        return {"kind": fit.kind, **result.to_record()}
    if isinstance(fit, KaplanMeierFit):
        km = fedstats.KaplanMeier(fit.time, fit.event, width=fit.width, horizon=fit.horizon)
        table = km.fit(federation).to_frame()
        return {"kind": fit.kind, "table": json.loads(table.to_json(orient="split"))}
    raise TypeError(f"unknown fit {fit!r}")


def result_path(out: Path, name: str) -> Path:
    """Where the result of fit ``name`` is written."""
    return out / RESULTS_DIR / f"{name}.json"


def write_json_atomically(path: Path, record: Any) -> None:
    """Write JSON to a temporary file, flush it to disk, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def run_fits(
    config: StudyConfig,
    federation: Federation,
    *,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Make every configured fit not already recorded under ``config.study.out``.

    Returns every fit's result, the recorded ones included; each new result
    is written as soon as its fit completes.
    """
    out = config.study.out
    results: dict[str, dict[str, Any]] = {}
    for fit in config.fits:
        path = result_path(out, fit.name)
        if path.is_file():
            results[fit.name] = json.loads(path.read_text(encoding="utf-8"))
            continue
        record = make_fit(fit, federation)
        write_json_atomically(path, record)
        results[fit.name] = record
        if on_result is not None:
            on_result(fit.name, record)
    return results
