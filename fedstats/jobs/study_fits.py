"""Making a study's configured fits on any federation, and recording their results.

The same function runs in the embedded runtime and inside the Flower
ServerApp, so the two can be compared number for number. Results are
written one file per fit as each fit completes (atomically), and a fit
whose file exists is not made again: a study stopped by a lost site
resumes where it stopped. The study's record linkages (``[[links]]``) are
made first, under the same rule (:mod:`fedstats.jobs.study_links`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

import fedstats
from fedstats.jobs.study_config import (
    CoxFit,
    DeepFit,
    FineGrayFit,
    Fit,
    GlmFit,
    KaplanMeierFit,
    LogisticFit,
    SecureAggregationOptions,
    StudyConfig,
    VerticalLogisticFit,
)
from fedstats.jobs.study_links import run_links
from fedstats.models.federation import Federation
from studyfiles.durable import write_json_atomically
from studyfiles.json_values import json_number, json_tree

RESULTS_DIR = "results"


def make_fit(fit: Fit, federation: Federation) -> dict[str, Any]:
    """Run one configured fit and return its result as plain JSON values (full precision),
    with ``analyses``: the message-inventory labels of every analysis the fit started, which
    the study's compliance report ties to this result."""
    with federation.analyses_started() as analyses:
        record = _fitted(fit, federation)
    return {**record, "analyses": list(analyses)}


def _secure(options: SecureAggregationOptions | None) -> fedstats.SecureAggregation | None:
    """The fit's :class:`fedstats.SecureAggregation`, or ``None`` for plain replies."""
    if options is None:
        return None
    return fedstats.SecureAggregation(**options.model_dump(exclude_none=True))


def _fitted(fit: Fit, federation: Federation) -> dict[str, Any]:
    if isinstance(fit, LogisticFit):
        result = fedstats.LogisticRegression(fit.formula, site_intercepts=fit.site_intercepts).fit(
            federation, secure_aggregation=_secure(fit.secure_aggregation)
        )
        return {"kind": fit.kind, **result.to_record()}
    if isinstance(fit, GlmFit):
        options = fit.model_dump(exclude={"kind", "name", "formula", "secure_aggregation"})
        glm = fedstats.GLM(fit.formula, **options)
        result = glm.fit(federation, secure_aggregation=_secure(fit.secure_aggregation))
        return {"kind": fit.kind, **result.to_record()}
    if isinstance(fit, CoxFit):
        cox = fedstats.CoxPH(fit.formula, strata=fit.strata, ties=fit.ties, weights=fit.weights)
        result = cox.fit(federation, secure_aggregation=_secure(fit.secure_aggregation))
        return {"kind": fit.kind, **result.to_record()}
    if isinstance(fit, FineGrayFit):
        options = fit.model_dump(exclude={"kind", "name", "formula"})
        fine_gray = fedstats.FineGray(fit.formula, **options)
        return {"kind": fit.kind, **fine_gray.fit(federation).to_record()}
    if isinstance(fit, KaplanMeierFit):
        km = fedstats.KaplanMeier(
            fit.time,
            fit.event,
            group=fit.group,
            width=fit.width,
            horizon=fit.horizon,
            sparse_events=fit.sparse_events,
            weights=fit.weights,
        )
        return {"kind": fit.kind, **km.fit(federation).to_record()}
    if isinstance(fit, DeepFit):
        return {"kind": fit.kind, **deep_record(train_deep(fit, federation))}
    if isinstance(fit, VerticalLogisticFit):
        vertical = fedstats.VerticalLogisticRegression(
            fit.formula,
            outcome_site=fit.outcome_site,
            covariate_sites=fit.covariate_sites,
            linkage_id=dict(zip(fit.covariate_sites, fit.linkage, strict=True)),
            maxiter=fit.maxiter,
        )
        return {"kind": fit.kind, **vertical.fit(federation).to_record()}
    raise TypeError(f"unknown fit {fit!r}")


def train_deep(fit: DeepFit, federation: Federation) -> Any:
    """Train the configured network (no progress bar: this may run inside a ServerApp)."""
    from fedstats.deep import FederatedTrainer  # torch is imported only for deep fits

    trainer = FederatedTrainer(
        fit.model,
        fit.hyper,
        formula=fit.formula,
        bounds={column: (low, high) for column, (low, high) in fit.bounds.items()},
        algorithm=fit.algorithm,
        mu=fit.mu,
        rounds=fit.rounds,
        local_steps=fit.local_steps,
        local_epochs=fit.local_epochs,
        lr=fit.lr,
        batch_size=fit.batch_size,
        seed=fit.seed,
        progress=False,
    )
    return trainer.fit(federation)


def deep_record(result: Any) -> dict[str, Any]:
    """A trained network as JSON: final ``weights`` (nested lists, in ``state_dict`` order,
    named by ``weight_names``), the input columns and their scaling, the per-round history,
    the evaluation table (sites and pooled) and provenance."""
    names = list(result.state_dict)
    history = result.history.astype(object).where(result.history.notna(), None)
    evaluation = None
    if result.evaluation is not None:
        table = result.evaluation.to_frame()
        evaluation = {
            "kind": result.evaluation.kind,
            "table": {
                str(row): {str(k): json_number(v) for k, v in values.items()}
                for row, values in table.to_dict(orient="index").items()
            },
        }
    return {
        "model": result.model,
        "hyper": dict(result.hyper),
        "algorithm": result.algorithm,
        "columns": list(result.columns),
        "scaling": np.asarray(result.scaling, dtype=np.float64).tolist(),
        "weight_names": names,
        "weights": [np.asarray(array, dtype=np.float64).tolist() for array in result.weights],
        "history": [
            {str(k): json_number(v) for k, v in row.items()} for row in history.to_dict("records")
        ],
        "evaluation": evaluation,
        "provenance": result.provenance.to_record(),
        "privacy": None if result.privacy is None else json_tree(asdict(result.privacy)),
        "notes": list(result.notes),
    }


def result_path(out: Path, name: str) -> Path:
    """Where the result of fit ``name`` is written."""
    return out / RESULTS_DIR / f"{name}.json"


def run_fits(
    config: StudyConfig,
    federation: Federation,
    *,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
    on_link: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Make every configured linkage, then every configured fit, not already recorded under
    ``config.study.out``.

    Returns every fit's result, the recorded ones included; each new result
    is written as soon as its fit completes (each new linkage's record as soon as it
    completes, :func:`fedstats.jobs.study_links.run_links`).
    """
    run_links(config, federation, on_link=on_link)
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
