"""A design's outcome and row attributes read from a site's rows, each checked by name.

The outcome of each kind — 0/1 (logistic, binomial GLM), a count or a
measurement (Poisson and Gaussian GLMs), ``Surv(time, event)`` and
``Surv(start, stop, event)`` (Cox) — plus strata codes and a Poisson model's
log exposure. Every refusal is a typed error naming the site, the column and
how many rows are bad; a formula's left-hand side (``I(chol > 240)``) is
evaluated by the site's own evaluator (:mod:`fedstats.contract.formula_grammar`),
never as text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedstats.contract.design import DesignSpec, ParsedFormula, counting_outcome, survival_outcome
from fedstats.contract.formula_grammar import Factor, Indicator, evaluate
from fedstats.errors import (
    DomainError,
    FormulaRefusedError,
    InconsistentColumnError,
    MalformedRequestError,
    NoEventsError,
    NonBinaryOutcomeError,
    UnsafeTermError,
)
from fedstats.site.column_values import as_numbers, event_flags, follow_up_times


def survival_outcome_values(
    site: str, spec: DesignSpec, data: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Follow-up (stop) times, 0/1 event indicators and entry times (``None`` for
    ``Surv(time, event)``), checked: see :func:`counting_entry_times` for
    ``Surv(start, stop, event)``."""
    counting = counting_outcome(spec.outcome)
    names = survival_outcome(spec.outcome) if counting is None else counting[1:]
    if names is None:
        raise MalformedRequestError(site=None, task=None, reason="not a survival outcome")
    time_name, event_name = names
    time = follow_up_times(site, time_name, data[time_name])
    event = event_flags(site, event_name, data[event_name])
    if counting is None:
        return time, event, None
    return time, event, counting_entry_times(site, counting, data, time)


def counting_entry_times(
    site: str, names: tuple[str, str, str], data: pd.DataFrame, stop: np.ndarray
) -> np.ndarray:
    """The entry times of ``Surv(start, stop, event)``, checked against the stops.

    Times are measured from an origin at or before everyone's entry, so a
    start is a finite number ``>= 0`` (R and lifelines accept negative starts;
    the shared time grids of the pooled model and Kaplan–Meier begin at 0, so
    a site shifts its time axis instead). Every row needs ``start < stop``:
    an empty interval is no follow-up at all. When the frame's index repeats
    (the patient of each row), one patient's intervals may not overlap: a
    patient is at risk at most once at any time, so counts of rows at risk
    are counts of patients.
    """
    start_name, stop_name, _ = names
    start = follow_up_times(site, start_name, data[start_name])
    empty = int((start >= stop).sum())
    if empty:
        raise InconsistentColumnError(
            site=site,
            column=start_name,
            reason=(
                f"has {empty} rows whose start is not before their stop {stop_name!r}; each row "
                "is an interval (start, stop] of follow-up: fix or drop those rows"
            ),
        )
    if data.index.has_duplicates:
        order = np.lexsort((start, pd.factorize(data.index)[0]))
        patient = pd.factorize(data.index)[0][order]
        same = patient[1:] == patient[:-1]
        overlaps = int((same & (start[order][1:] < stop[order][:-1])).sum())
        if overlaps:
            raise InconsistentColumnError(
                site=site,
                column=start_name,
                reason=(
                    f"has {overlaps} rows that overlap an earlier interval of the same patient "
                    "(the frame's index names each row's patient); a patient is at risk once at "
                    "any time: fix the intervals"
                ),
            )
    return start


def strata_codes(data: pd.DataFrame, strata: tuple[str, ...]) -> np.ndarray:
    """One code per combination of the strata columns' values (all rows 0 without strata)."""
    if not strata:
        return np.zeros(len(data), dtype=np.int64)
    return data.groupby(list(strata), sort=True, observed=True).ngroup().to_numpy(np.int64)


def outcome_values(
    site: str, outcome: str, parsed: ParsedFormula, raw: pd.DataFrame, collect: Indicator
) -> np.ndarray:
    """The outcome's values on the design's rows: its column as numbers, or the site's own
    evaluation of the formula's left-hand side (e.g. ``I(chol > 240)``)."""
    factor = parsed.outcome_factor
    if factor is None or factor.kind == "column":
        return as_numbers(raw[outcome])
    return evaluated_factor(site, factor, raw, collect)


def binary_outcome(
    site: str, outcome: str, parsed: ParsedFormula, raw: pd.DataFrame, collect: Indicator
) -> np.ndarray:
    """A 0/1 outcome with both values present (else the site would disclose every row's)."""
    y = outcome_values(site, outcome, parsed, raw, collect)
    other = int((~np.isin(y, (0.0, 1.0))).sum())
    if other:
        raise NonBinaryOutcomeError(site=site, column=outcome, count=other)
    events = int(y.sum())
    if events == 0 or events == len(y):
        raise NoEventsError(site=site, column=outcome, outcome_value=int(events > 0))
    return y


def log_exposure(site: str, values: pd.Series) -> np.ndarray:
    """``log(exposure)``: every exposure a finite number ``> 0`` (person-time at risk)."""
    exposure = as_numbers(values)
    bad = ~np.isfinite(exposure) | (exposure <= 0)
    if bad.any():
        raise InconsistentColumnError(
            site=site,
            column=str(values.name),
            reason=f"has {int(bad.sum())} exposures that are not finite numbers > 0",
        )
    return np.log(exposure)


def numeric_outcome(
    site: str, spec: DesignSpec, parsed: ParsedFormula, raw: pd.DataFrame, collect: Indicator
) -> np.ndarray:
    """A count (finite, ``>= 0``; not 0 for every row) or a measurement (finite)."""
    y = outcome_values(site, spec.outcome, parsed, raw, collect)
    count = spec.outcome_kind == "count"
    bad = ~np.isfinite(y) | ((y < 0) if count else False)
    if bad.any():
        what = "counts (finite numbers >= 0)" if count else "finite numbers"
        raise InconsistentColumnError(
            site=site,
            column=spec.outcome,
            reason=f"has {int(bad.sum())} values that are not {what}",
        )
    if count and not y.any():
        raise NoEventsError(site=site, column=spec.outcome, outcome_value=0)
    return y


def evaluated_factor(
    site: str, factor: Factor, raw: pd.DataFrame, collect: Indicator
) -> np.ndarray:
    """An expression factor's values on the design's rows (the site's own evaluator)."""
    try:
        return evaluate(factor, {v: raw[v] for v in factor.variables}, collect)
    except UnsafeTermError as error:
        raise FormulaRefusedError(
            site=site, task=None, term=error.token, reason=error.reason
        ) from None
    except DomainError:
        raise InconsistentColumnError(
            site=site,
            column=factor.name,
            reason="cannot be computed for every row (a value outside the domain of a function, "
            "a division by zero or an overflow); compute it during harmonisation",
        ) from None
