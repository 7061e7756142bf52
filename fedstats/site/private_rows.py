"""A private request is answered or refused on the request alone, and reads only usable rows.

An exact release refuses bad values — a missing value under
``missing="raise"``, a level outside the agreed ones, an outcome that is not
0/1, a follow-up time below 0, a value outside a function's domain — naming
how many rows are bad. Under differential privacy that refusal would itself
be a release that no ledger charged: a coordinator that crafts a request
valid only when one patient's outcome is 0 (``I(disease + (age == 63))``
as the outcome) reads that outcome from whether the site answers, ok or
error, for the epsilon of a few noisy counts. So for every private request:

1. **Decided before any row is read.** :func:`check_private_request` refuses,
   from the request alone, what a private release cannot answer whatever the
   rows: an outcome that is not a column or a true/false expression (its
   validity would depend on values), ``Surv(start, stop, event)`` (a patient's
   several rows), count and measurement outcomes (no bound), frequency weights
   (a weight multiplies one patient's influence). Everything else the site
   decides from its public metadata (column names and kinds, the approved
   protocol, its ledger).
2. **Total on the rows.** A row on which any value is unusable is left out
   of the release, as a missing value is, and counted among the dropped rows
   (which ``prepare`` releases only with noise): :func:`usable_outcome`,
   :func:`usable_survival`, :func:`outside_levels` and the site's evaluator in
   its total mode (:func:`fedstats.contract.formula_grammar.evaluate`). No
   threshold on the number of rows applies (the noise protects small counts),
   so an empty release is answered like any other.

Leaving a row out depends on that row alone, so neighbouring frames (one
patient added, removed or changed) still give neighbouring sets of rows and
the release keeps the sensitivity it is charged for (Dwork & Roth 2014,
Prop. 2.1: post-processing; a row-wise filter is a stable transformation of
stability 1, McSherry, SIGMOD 2009, PINQ's ``Where``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.design import (
    DesignSpec,
    counting_outcome,
    normalise_level,
    survival_outcome,
)
from fedstats.contract.formula_grammar import evaluate
from fedstats.errors import (
    DisclosureError,
    MalformedRequestError,
    MissingColumnError,
)
from fedstats.site.column_values import as_numbers
from fedstats.site.formula_check import checked_formula

RULE = "private-request"
"""The disclosure rule a private request refused from its text alone is reported under."""


def check_private_request(
    site: str, task: str, args: dict[str, Any], columns: Iterable[str]
) -> None:
    """Refuse, before any row is read, a private request whose answer would depend on values.

    Only the request and the names of the site's columns (public: the site's
    fingerprint lists them) are read. Raises
    :class:`~fedstats.errors.DisclosureError` (rule ``private-request``)
    naming what to change, or :class:`~fedstats.errors.MissingColumnError`.
    """
    named: list[Any] = [args.get(k) for k in ("time", "event", "group", "weights")]
    strata = args.get("strata")
    named += strata if isinstance(strata, list) else []
    wire = args.get("design")
    if isinstance(wire, dict):
        try:
            spec = DesignSpec.from_wire(wire)
        except ValueError as error:
            raise MalformedRequestError(site=site, task=task, reason=str(error)) from None
        parsed = checked_formula(spec)  # a malformed design is refused before the charge too
        problem = _private_problem(spec, parsed.outcome_factor)
        if problem is not None:
            raise DisclosureError(site=site, task=task, reason=problem, rule=RULE)
        named += [*spec.variables, *spec.strata, spec.offset, spec.weights, spec.exposure]
    held = set(columns)
    for name in named:
        if isinstance(name, str) and name not in held:
            raise MissingColumnError(site=site, column=name)


def _private_problem(spec: DesignSpec, outcome_factor: Any) -> str | None:
    if spec.outcome_kind in ("count", "continuous"):
        return (
            f"no differentially private release is offered for a {spec.outcome_kind} "
            "outcome: it has no bound, so one patient's influence has none either"
        )
    if spec.weights is not None:
        return (
            "a differentially private release takes no frequency weights: its noise is "
            "calibrated to rows that count once, and a weight would multiply one patient's "
            "influence"
        )
    if spec.outcome_kind == "survival" and counting_outcome(spec.outcome) is not None:
        return (
            f"a differentially private release of {spec.outcome} is not offered: its patients "
            "may have several rows; ask with Surv(time, event)"
        )
    if spec.outcome_kind == "binary" and not _binary_by_construction(outcome_factor):
        return (
            f"the outcome {spec.outcome!r} of a private request must be a column or a "
            "true/false expression (a comparison, &, | or ~), so that whether it is 0/1 "
            "never depends on a patient's values"
        )
    return None


def _binary_by_construction(factor: Any) -> bool:
    """A plain column, or an ``I()`` whose top operation yields true/false for every value."""
    if factor is None or factor.kind == "column":
        return True
    tree = factor.tree
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "I":
        tree = tree.args[0]
    return (
        isinstance(tree, ast.Compare)
        or (isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.BitAnd | ast.BitOr))
        or (isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Invert))
    )


def outside_levels(data: pd.DataFrame, levels: dict[str, tuple]) -> np.ndarray:
    """Rows holding a value outside the agreed levels of any ``levels`` column."""
    bad = np.zeros(len(data), dtype=bool)
    for var, agreed in levels.items():
        allowed = {normalise_level(v) for v in agreed}
        values = data[var].map(lambda v: normalise_level(v.item() if hasattr(v, "item") else v))
        bad |= ~values.isin(allowed).to_numpy()
    return bad


def usable_outcome(y: np.ndarray) -> np.ndarray:
    """Rows whose binary outcome is 0 or 1."""
    return np.isin(y, (0.0, 1.0))


def usable_survival(time: pd.Series, event: pd.Series) -> np.ndarray:
    """Rows whose follow-up time is a finite number ``>= 0`` and whose event flag is 0 or 1."""
    t = as_numbers(time)
    with np.errstate(invalid="ignore"):
        return np.isfinite(t) & (t >= 0) & np.isin(as_numbers(event), (0.0, 1.0))


def usable_private_rows(
    spec: DesignSpec,
    parsed: Any,
    data: pd.DataFrame,
    raw: pd.DataFrame,
    positions: np.ndarray,
) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, int, np.ndarray | None, dict[str, np.ndarray]]:
    """The rows of a private design on which every value is usable, and their values.

    A row is left out when its binary outcome is not 0/1, its follow-up time
    is not a finite number ``>= 0`` or its event flag not 0/1, a numeric
    column or the offset holds a value that is not finite, or an expression
    of the formula has no finite value on it (the evaluator's total mode).
    Returns the kept ``data``, ``raw`` and ``positions``, the number left out,
    the binary outcome (``None`` for a survival design) and each expression
    factor's values, all over the kept rows.
    """
    usable = np.ones(len(data), dtype=bool)
    values: dict[str, np.ndarray] = {}
    for factor in parsed.factors:
        if factor.kind == "expression":
            value = evaluate(factor, {v: raw[v] for v in factor.variables}, total=True)
            values[factor.name] = value
            usable &= np.isfinite(value)
        elif factor.kind == "column" and factor.column not in spec.levels:
            column = raw[factor.column]
            if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
                usable &= np.isfinite(as_numbers(column))
    y = None
    if spec.outcome_kind == "survival":
        names = survival_outcome(spec.outcome)
        if names is None:
            raise MalformedRequestError(site=None, task=None, reason="not a survival outcome")
        usable &= usable_survival(data[names[0]], data[names[1]])
    else:
        factor = parsed.outcome_factor
        y = (
            as_numbers(raw[spec.outcome])
            if factor is None or factor.kind == "column"
            else evaluate(factor, {v: raw[v] for v in factor.variables}, total=True)
        )
        usable &= usable_outcome(y)
    if spec.offset:
        usable &= np.isfinite(as_numbers(data[spec.offset]))
    kept = {name: value[usable] for name, value in values.items()}
    return (
        data[usable],
        raw[usable],
        positions[usable],
        int((~usable).sum()),
        None if y is None else y[usable],
        kept,
    )
