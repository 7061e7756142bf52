"""Site side of the design: describe variables, build and validate the agreed design.

These handlers run inside a :class:`~fedstats.site.silo.Silo`. They read the
site's frame and return only what their task's schema declares.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.design import (
    DesignSpec,
    counting_outcome,
    parse_formula,
)
from fedstats.contract.design_matrix import (
    agreed_codes,
    design_columns,
    plain,
    right_hand_side,
    site_columns,
    stacked,
)
from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.tasks.design import _string_list, spec_from_args
from fedstats.errors import (
    DisclosureError,
    FormulaError,
    InconsistentColumnError,
    MalformedRequestError,
    MissingColumnError,
    MissingValuesError,
    UnknownLevelError,
)
from fedstats.site.cell_rules import check_columns, check_groups, check_indicator
from fedstats.site.column_values import as_numbers
from fedstats.site.cross_cells import check_cross_cells, level_masks, two_valued_columns
from fedstats.site.design_cache import BoundedCache, design_digest, design_key
from fedstats.site.design_outcomes import (
    binary_outcome,
    evaluated_factor,
    log_exposure,
    numeric_outcome,
    strata_codes,
    survival_outcome_values,
)
from fedstats.site.disclosure import check_levels, check_saturation
from fedstats.site.formula_check import checked_formula
from fedstats.site.frame_layout import buffer_of
from fedstats.site.patient_rows import count_patients, patient_release_sets, patients_of
from fedstats.site.private_rows import outside_levels, usable_private_rows
from fedstats.site.task import SiteContext, TaskReply
from fedstats.site.weights import check_weight_dominance, frequency_weights


@dataclass(frozen=True)
class SiteDesign:
    """The agreed design built from one site's rows (never leaves the site)."""

    columns: tuple[np.ndarray, ...]
    """The design's columns in the agreed order, each one contiguous, read-only float64 array
    (a numeric column's are the frame's own values, not copied)."""
    y: np.ndarray
    """The 0/1 outcome; for a survival design, the event indicator."""
    offset: np.ndarray | None
    n_dropped: int
    time: np.ndarray | None = None
    """Follow-up times of a survival design."""
    stratum: np.ndarray | None = None
    """Stratum codes (0, 1, ...) of a survival design's rows within this site."""
    rows: np.ndarray | None = None
    """Positions of the frame's rows the design holds, in order (complete cases)."""
    indicators: tuple[tuple[str, np.ndarray], ...] = ()
    """Every true/false value the formula computed, by its text (masks over the design's rows)."""
    entry: np.ndarray | None = None
    """Entry times of a ``Surv(start, stop, event)`` design (``time`` holds the stops): each row
    is at risk on ``(entry, time]``; ``None`` for ``Surv(time, event)``."""
    weights: np.ndarray | None = None
    """Frequency weights of the design's rows (:mod:`fedstats.site.weights`); ``None``: each
    row counts once. Rows of weight 0 stay in the design and add 0 to every sum."""
    column_bytes: int = 0
    """The bytes its columns keep in memory besides the frame's own arrays
    (:func:`kept_bytes`)."""

    @property
    def n_obs(self) -> int:
        return len(self.y)

    @property
    def held_bytes(self) -> int:
        """The memory the design holds: its own columns and row attributes, and the row-major
        array once built (what :mod:`fedstats.site.design_cache` bounds)."""
        arrays = [self.y, self.offset, self.time, self.stratum, self.rows, self.entry]
        arrays += [self.weights, *(mask for _, mask in self.indicators), vars(self).get("X")]
        return self.column_bytes + sum(a.nbytes for a in arrays if a is not None)

    @functools.cached_property
    def X(self) -> np.ndarray:
        """The design as one row-major array, built from :attr:`columns` when first read
        (the exact rounds of logistic regression and GLMs read the columns a block of rows
        at a time and never build it)."""
        return stacked(list(self.columns), self.n_obs)


# ---------------------------------------------------------------- describe


def describe(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Kind of each variable ("numeric" or "categorical") and levels where needed.

    Levels are listed for non-numeric columns and for numeric columns the
    formula wraps in ``C()``, except those in ``levels_known`` (fixed by the
    study) and unless ``list_levels`` is false (private analyses take their
    levels from the study, not from the data); identifier-like columns are
    refused.
    """
    variables = _string_list(args, "variables")
    levels_for = set(_string_list(args, "levels_for"))
    known = set(_string_list(args, "levels_known"))
    list_levels = args["list_levels"] is True
    frame = ctx.frame
    payload: dict[str, Any] = {}
    for var in variables:
        if var not in frame.columns:
            raise MissingColumnError(site=ctx.name, column=var)
        column = frame[var]
        numeric = pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
        payload[f"{var}.kind"] = "numeric" if numeric else "categorical"
        levels: list = []
        if list_levels and var not in known and (not numeric or var in levels_for):
            if ctx.policy.require_privacy:
                raise DisclosureError(
                    site=ctx.name,
                    task="describe",
                    reason=f"this site releases no categorical levels (of {var!r}); "
                    "declare them in the study",
                )
            present = column.dropna().unique()
            check_levels(
                ctx.policy,
                site=ctx.name,
                task="describe",
                column=var,
                n_levels=len(present),
                n_patients=len(frame),
            )
            levels = sorted({plain(v) for v in present}, key=lambda v: (isinstance(v, str), v))
        payload[f"{var}.levels"] = levels
    return TaskReply(payload, contributors=len(frame))


# ---------------------------------------------------------------- prepare


def prepare_private_release(args: dict[str, Any]) -> list[NoisyGroup]:
    """Under privacy the three counts are one Gaussian release.

    Adding or removing one patient changes ``n_obs`` by 1 and ``n_events`` by
    at most 1 (a complete row) or ``n_dropped`` by 1 (an incomplete one), so
    the L2 sensitivity of the three counts together is ``sqrt(2)``. On a frame
    with several rows per patient the private counts count patients
    (:func:`patient_counts`), so the bound holds for a patient of any number of rows.
    """
    return [NoisyGroup(("n_obs", "n_dropped", "n_events"), l2_sensitivity=math.sqrt(2))]


def prepare(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Build and validate the agreed design; report the site's counts: ``n_obs`` counts
    patients (a frame indexed by patient may hold several rows, intervals, per patient)."""
    spec = spec_from_args(args)
    design = site_design(ctx, spec)
    if ctx.private(args) and patients_of(ctx.frame) is not None:
        counts = patient_counts(ctx, design)
        return TaskReply(counts, contributors=counts["n_obs"])
    patients = count_patients(ctx, design.rows, design.n_obs)
    return TaskReply(
        {"n_obs": patients, "n_dropped": design.n_dropped, "n_events": events(spec, design)},
        contributors=patients,
    )


def patient_counts(ctx: SiteContext, design: SiteDesign) -> dict[str, int]:
    """The private counts of a frame with several rows per patient, each patient counted once:
    ``n_obs`` patients with a complete row, ``n_dropped`` patients with none (so each patient is
    in exactly one of the two), ``n_events`` patients with the outcome or event on a complete row
    (a private release takes only 0/1 outcomes). Removing one patient moves ``n_obs`` or
    ``n_dropped`` by 1 and ``n_events`` by at most 1: the ``sqrt(2)`` of
    :func:`prepare_private_release`."""
    patients = patients_of(ctx.frame)
    if patients is None:  # one row per patient: each row is its own patient
        patients = np.arange(len(ctx.frame))
    rows = np.arange(len(patients)) if design.rows is None else design.rows
    kept = np.unique(patients[rows])
    with_event = np.unique(patients[rows][design.y > 0])
    return {
        "n_obs": len(kept),
        "n_dropped": int(patients.max()) + 1 - len(kept),
        "n_events": len(with_event),
    }


def events(spec: DesignSpec, design: SiteDesign) -> float:
    """The events a site reports: patients with the outcome or event, or the total count of a
    count outcome (a Poisson model's cases); none for a measurement."""
    if spec.outcome_kind == "continuous":
        return 0
    total = float(design.y.sum())
    return int(total) if total.is_integer() else total


def site_design(ctx: SiteContext, spec: DesignSpec) -> SiteDesign:
    """The site's design for ``spec``, built once and kept while memory allows
    (:mod:`fedstats.site.design_cache`)."""
    if spec.outcome_kind in ("count", "continuous") and not ctx.exact:
        raise DisclosureError(
            site=ctx.name,
            task=None,
            reason=(
                f"no differentially private release is offered for a {spec.outcome_kind} "
                "outcome: it has no bound, so one patient's influence has none either"
            ),
            rule="privacy-required",
        )
    if spec.weights is not None and not ctx.exact:
        raise DisclosureError(
            site=ctx.name,
            task=None,
            reason=(
                "a differentially private release takes no frequency weights: its noise is "
                "calibrated to rows that count once, and a weight would multiply one "
                "patient's influence"
            ),
            rule="privacy-required",
        )
    cache: BoundedCache = ctx.cache.setdefault("designs", BoundedCache())
    # a private design leaves unusable rows out; an exact one refuses (fedstats.site.design_cache)
    key = design_key(spec, exact=ctx.exact, frame=ctx.frame)
    design = cache.get(key)
    if design is not None:
        if ctx.exact:
            check_exact_release(ctx, spec, design)
        return design
    design = build_design(ctx, spec)
    cache.put(key, design)
    return design


def build_design(ctx: SiteContext, spec: DesignSpec, *, saturation: bool = True) -> SiteDesign:
    """Build the agreed design from the site's frame, refusing anything inconsistent.

    Raises a typed :class:`~fedstats.errors.SiteDataError` naming the site and
    column for a missing column, missing values (with their count), a level
    outside the agreed ones, a non-binary outcome, an outcome without events,
    or a design that does not reproduce the agreed columns.
    """
    site, frame = ctx.name, ctx.frame
    parsed = checked_formula(spec)
    needed = (
        list(spec.variables)
        + ([spec.offset] if spec.offset else [])
        + list(spec.strata)
        + ([spec.weights] if spec.weights else [])
        + ([spec.exposure] if spec.exposure else [])
    )
    for var in needed:
        if var not in frame.columns:
            raise MissingColumnError(site=site, column=var)
    data = frame_columns(frame, needed)
    private = not ctx.exact
    n_dropped = 0
    if any(data[var].hasnans for var in data.columns):
        incomplete = data.isna()
        if spec.missing == "raise" and not private:
            counts = incomplete.sum()
            var = str(counts[counts > 0].index[0])
            raise MissingValuesError(site=site, column=var, count=int(counts[var]))
        keep = ~incomplete.any(axis=1)
        n_dropped = int((~keep).sum())
        data = data[keep]
        positions = np.flatnonzero(keep.to_numpy())
    else:
        positions = np.arange(len(data))
    if private:  # rows with a value outside the agreed levels are left out, not refused
        outside = outside_levels(data, spec.levels)
        if outside.any():
            n_dropped += int(outside.sum())
            data, positions = data[~outside], positions[~outside]
    raw = data  # the values as the site holds them (nothing below writes to them)
    if spec.levels:
        data = data.copy()
        for var, levels in spec.levels.items():
            data[var] = as_agreed_categorical(site, var, data[var], levels)

    indicators: list[tuple[str, np.ndarray]] = []
    collect = lambda term, mask: indicators.append((term, np.asarray(mask, bool)))  # noqa: E731
    survival = spec.outcome_kind == "survival"
    time = stratum = entry = None
    if private:
        data, raw, positions, dropped, y, values = usable_private_rows(
            spec, parsed, data, raw, positions
        )
        n_dropped += dropped
    if survival:
        time, y, entry = survival_outcome_values(site, spec, data)
        stratum = strata_codes(data, spec.strata)
    elif private:
        pass  # the 0/1 outcome of the usable rows
    elif spec.outcome_kind == "binary":
        y = binary_outcome(site, spec.outcome, parsed, raw, collect)
    else:
        y = numeric_outcome(site, spec, parsed, raw, collect)
    if not private:
        values = {}
    for factor in parsed.factors:
        if factor.kind == "expression":
            if not private:
                values[factor.name] = evaluated_factor(site, factor, raw, collect)
        elif factor.kind == "categorical" and factor.column not in spec.levels:
            raise MalformedRequestError(
                site=None, task=None, reason=f"{factor.name} needs agreed levels in the design"
            )
        else:
            values[factor.name] = (
                data[factor.column].to_numpy()
                if not isinstance(data[factor.column].dtype, pd.CategoricalDtype)
                else data[factor.column].array
            )
    try:
        rhs = right_hand_side(parsed, values, len(data)) if len(data) else None
    except FormulaError:
        raise InconsistentColumnError(
            site=site, column=spec.formula, reason="cannot be built from this site's columns"
        ) from None
    expected = [c for c in spec.columns if c not in site_columns(spec)]
    got = (
        expected  # no usable row (a private release): the agreed columns, empty
        if rhs is None
        else [
            c for c in rhs.columns if not ((spec.site_intercepts or survival) and c == "Intercept")
        ]
    )
    if got != expected:
        raise InconsistentColumnError(
            site=site,
            column=spec.formula,
            reason=f"yields design columns {got}, not the agreed {expected}",
        )
    built = design_columns(spec, rhs, len(data), site)
    columns = [read_only(c) for c in built]
    bad = [j for j, column in enumerate(columns) if not np.isfinite(column).all()]
    if bad:
        raise InconsistentColumnError(
            site=site, column=spec.columns[bad[0]], reason="has non-finite values"
        )
    offset = None
    if spec.offset:
        offset = as_numbers(data[spec.offset])
        if not np.isfinite(offset).all():
            raise InconsistentColumnError(
                site=site, column=spec.offset, reason="must be a finite numeric offset"
            )
    if spec.exposure:
        offset = (0.0 if offset is None else offset) + log_exposure(site, data[spec.exposure])
    weights = None
    if spec.weights:
        weights = frequency_weights(site, data[spec.weights], spec.weights)
    varying = sum(bool(column.any()) for column in columns)
    if saturation and not private:  # off for replies of a few counts (concordance), and for
        # private releases, whose noise protects any design and whose answer may not depend
        # on which columns vary
        check_saturation(
            ctx.policy, site=site, task="prepare", n_parameters=varying, n_patients=len(y)
        )
    design = SiteDesign(
        columns=tuple(columns),
        y=np.array(y),  # the design's own arrays (its columns are read-only)
        offset=None if offset is None else np.array(offset),
        n_dropped=n_dropped,
        time=None if time is None else np.array(time),
        entry=None if entry is None else np.array(entry),
        stratum=stratum,
        rows=positions,
        indicators=tuple(indicators),
        weights=None if weights is None else np.array(weights),
        column_bytes=kept_bytes(built, frame, needed),
    )
    if ctx.exact:
        check_exact_release(ctx, spec, design)
    return design


def read_only(column: np.ndarray) -> np.ndarray:
    """A view of ``column`` that cannot be written to (a design may read the frame's own
    arrays; nothing may change them through it)."""
    view = column.view()
    view.flags.writeable = False
    return view


def kept_bytes(columns: list[np.ndarray], frame: pd.DataFrame, names: list[str]) -> int:
    """The bytes ``columns`` keep in memory besides the arrays of the frame's columns
    ``names``: the whole buffer under each column, counted once, since a view keeps all of
    it (formulaic's model matrix, or the rows left when incomplete ones are dropped)."""
    names = list(dict.fromkeys(names)) if frame.columns.is_unique else []
    # only a float64 column is read without a copy; its buffers are held while ids compare
    frames = [buffer_of(frame[n].to_numpy()) for n in names if frame[n].dtype == np.float64]
    shared = {id(buffer) for buffer in frames}
    buffers = {id(buffer): buffer for buffer in map(buffer_of, columns)}
    return sum(buffer.nbytes for key, buffer in buffers.items() if key not in shared)


def frame_columns(frame: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """``frame[names]`` without copying the rows: a frame of the site's own column arrays
    (nothing that reads it writes to it; a column kept in a design is copied there)."""
    if not frame.columns.is_unique:
        return frame[names]
    return pd.DataFrame({name: frame[name] for name in dict.fromkeys(names)}, copy=False)


def check_exact_release(ctx: SiteContext, spec: DesignSpec, design: SiteDesign) -> None:
    """The small-cell rules and the differencing guard, before an exact release of ``design``.

    Checked once per design (a later round of the same design releases sums
    over the same rows): every indicator the formula computed, every design
    column (:func:`fedstats.site.cell_rules.check_columns`), the outcome or event
    indicator and the strata (:func:`fedstats.site.cell_rules.check_groups`); then
    the row sets of the design — its rows, each indicator's, each 0/1
    column's and each stratum's — and the columns it is computed from
    (:func:`answered_columns`) go to the differencing guard, which refuses a
    near-copy of a column it answered about before. Before the guard, the
    cross-cell rule (:func:`check_design_cross_cells`) on a binary or survival design.
    Each rule reads the design a column at a time (:attr:`SiteDesign.columns`).
    """
    checked: set = ctx.cache.setdefault("exact-checked designs", set())
    digest = design_digest(spec)
    if digest in checked:
        return
    columns = design.columns
    policy, site = ctx.policy, ctx.name
    for term, mask in design.indicators:
        check_indicator(policy, site=site, task=None, term=term, mask=mask)
    varying = [
        j
        for j, name in enumerate(spec.columns)
        if name != "Intercept" and name not in site_columns(spec)
    ]
    check_columns(
        policy,
        site=site,
        task=None,
        names=[spec.columns[j] for j in varying],
        X=[columns[j] for j in varying],
    )
    what = (
        "the event indicator"
        if spec.outcome_kind == "survival"
        else f"the outcome {spec.outcome!r}"
    )
    if spec.outcome_kind in ("binary", "survival"):
        check_groups(policy, site=site, task=None, what=what, codes=design.y)
    else:  # a count or a measurement: the mode and dominance rules of a design column
        check_columns(policy, site=site, task=None, names=[spec.outcome], X=design.y[:, None])
    if design.offset is not None:  # a spike in an offset (or exposure) singles out its row
        name = spec.offset or f"log({spec.exposure})"
        check_columns(policy, site=site, task=None, names=[name], X=design.offset[:, None])
    if design.weights is not None and spec.weights:
        check_weight_dominance(
            policy, site=site, task=None, column=spec.weights, weights=design.weights
        )
    if design.stratum is not None and spec.strata:
        check_groups(policy, site=site, task=None, what="the strata", codes=design.stratum)
    n, rows = len(ctx.frame), design.rows
    if rows is None:
        rows = np.arange(design.n_obs)

    def over_frame(mask: np.ndarray) -> np.ndarray:
        full = np.zeros(n, dtype=bool)
        full[rows[np.asarray(mask, bool)]] = True
        return full

    sets = [("the design's rows", over_frame(np.ones(design.n_obs, bool)))]
    if design.weights is not None:
        sets.append((f"the rows of positive {spec.weights}", over_frame(design.weights > 0)))
    sets += [(term, over_frame(mask)) for term, mask in design.indicators]
    for j in varying:
        column = columns[j]
        if distinct_values_exceed(column, 1) and not distinct_values_exceed(column, 2):
            sets.append((spec.columns[j], over_frame(column != column[0])))  # two values
    if design.stratum is not None and spec.strata:
        sets += [
            (f"stratum {s}", over_frame(design.stratum == s)) for s in np.unique(design.stratum)
        ]
    counting = counting_outcome(spec.outcome)
    sets += patient_release_sets(
        ctx,
        rows=rows,
        entry=design.entry,
        entry_name=counting[0] if counting else None,
        event=(what, design.y),
        columns=[(spec.columns[j], columns[j]) for j in varying],
        sets=sets,
        over_frame=over_frame,
    )
    if spec.outcome_kind in ("binary", "survival"):  # after the rules on one column at a time
        check_design_cross_cells(ctx, spec, design, rows, what, varying)
    patients = patients_of(ctx.frame)
    ctx.guard.check_release(
        site,
        None,
        sets,
        answered_columns(spec, design, varying),
        rows=rows,
        units=None if patients is None else patients[rows],
    )
    checked.add(digest)


def answered_columns(
    spec: DesignSpec, design: SiteDesign, varying: list[int]
) -> list[tuple[str, np.ndarray]]:
    """The columns an exact answer about ``design`` is computed from, for the differencing
    guard's near-copy check (:mod:`fedstats.site.near_copies`): every design column with
    three or more values (one with two values is a row set already), and the outcome,
    follow-up times, offset and weights whenever they vary. Not here: the 0/1 outcome and
    event indicator of a binary or survival design (the cell rules cover them), and the
    entry times of ``Surv(start, stop, event)``, which the study pins to one column per
    outcome (rule ``entry``, :mod:`fedstats.site.handlers.cox`).
    """
    answered = []
    for j in varying:
        if distinct_values_exceed(design.columns[j], 2):
            answered.append((spec.columns[j], design.columns[j]))
    roles = [
        (spec.outcome, design.y if spec.outcome_kind in ("count", "continuous") else None),
        (f"the follow-up times of {spec.outcome}", design.time),
        (spec.offset or f"log({spec.exposure})", design.offset),
        (spec.weights or "weights", design.weights),
    ]
    for label, values in roles:
        if values is not None and distinct_values_exceed(values, 1):
            answered.append((label, values))
    return answered


_FIRST_ROWS = 64
"""Rows :func:`distinct_values_exceed` looks at before it reads the whole column."""


def distinct_values_exceed(values: np.ndarray, count: int) -> bool:
    """Whether ``values`` hold more than ``count`` (1 or 2) distinct values, in linear time
    (at once when the first rows already hold more: a measurement, usually)."""
    if not len(values):
        return False
    if np.unique(values[:_FIRST_ROWS]).size > count:
        return True
    differs = values != values[0]
    if count == 1:
        return bool(differs.any())
    first = int(differs.argmax())  # the first row of a second value (row 0 when none)
    return bool(differs[first]) and bool((differs & (values != values[first])).any())


def check_design_cross_cells(
    ctx: SiteContext,
    spec: DesignSpec,
    design: SiteDesign,
    rows: np.ndarray,
    what: str,
    varying: list[int],
) -> None:
    """The cross-cell rule (:mod:`fedstats.site.cross_cells`) on a binary or survival design:
    its outcome or event indicator crossed with every two-valued design column, every level
    of every categorical term, every indicator the formula computed and every stratum."""
    crossed = two_valued_columns(
        [spec.columns[j] for j in varying], [design.columns[j] for j in varying]
    )
    categorical = {  # columns the design codes by level (an I() of a column codes no level)
        f.column for f in parse_formula(spec.formula).factors if f.kind in ("categorical", "column")
    }
    for var, levels in spec.levels.items():
        if var not in categorical:
            continue
        agreed = as_agreed_categorical(ctx.name, var, ctx.frame[var].iloc[rows], levels)
        crossed += level_masks(repr(var), np.asarray(agreed.codes), levels)
    crossed += [(repr(term), mask) for term, mask in design.indicators]
    if design.stratum is not None and spec.strata:
        crossed += [
            (f"a stratum of {list(spec.strata)}", design.stratum == s)
            for s in np.unique(design.stratum)
        ]
    patients = patients_of(ctx.frame)
    check_cross_cells(
        ctx.policy,
        site=ctx.name,
        task=None,
        outcome=(what, design.y),
        crossed=crossed,
        patients=None if patients is None else patients[rows],
        counted=None if design.weights is None else design.weights > 0,
    )


def as_agreed_categorical(site: str, var: str, column: pd.Series, levels: tuple) -> pd.Categorical:
    codes, unknown = agreed_codes(column, levels)
    if len(unknown):
        raise UnknownLevelError(
            site=site, column=var, level=plain(unknown.index[0]), count=int(unknown.iloc[0])
        )
    return codes
