"""Build the analysis frame a study specification defines from a site's record store.

The same rules apply whatever the source (FHIR or OMOP), because they read
only the :class:`~harmonize.records.RecordStore`:

* **index**: the first visit (or first condition in the index concept set)
  within ``[entry_start, entry_end]``;
* **cohort**: a known birth date, an index event, age at index within
  ``[min_age, max_age]``, alive at the index date (a person the source says
  died, without a date, is excluded: whether they were alive is unknown);
* **outcome**: binary — the event within ``(index, index + window_days]``;
  patients event-free whose follow-up ends before the window does are
  excluded — or time to event in days, censored at the end of follow-up (the
  last observation period's end, else the person's last record);
* **covariates**: age at index (years), sex, the last value of a measurement
  within the look-back (converted to the spec's UCUM unit; implausible values
  and unconvertible units are rejected), presence of a condition before the
  index, of a medication within the look-back;
* **records**: every record the reader represented is classified *included*
  (used in the frame) or *excluded* (with the reason), or *rejected* here.

A reader may represent records it has not validated yet (``events.unvalidated``:
FHIR Observations and Encounters, see :mod:`harmonize.fhir`). The frame also
names those it relies on (:attr:`FrameResult.unvalidated_relied_on`): the
records it uses (values, index events and outcome events of the cohort) or
quarantines, every person's index event, the records dated on the last day
of a cohort member's follow-up (when no observation period ends it), and
every value of a unit whose conversion depends on the analyte the codes
name. Any set of the *other* unvalidated records could be removed without
changing the frame, its quarantine or any other record's classification:
the index, the last value and the first event in the window stay where they
are (an outcome event after the window changes nothing: the follow-up's
last day does), the follow-up ends on the same day and no unit converts
differently. So once every record it relies on has been validated, and the
invalid ones removed, the frame is the one built from valid records only.

Concept sets match a record by ``(system, code)`` or by OMOP ``concept_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import pandas as pd

from harmonize import units
from harmonize.records import OUTSIDE_CONCEPTS, RecordStore
from harmonize.spec import SYSTEMS, Covariate, StudySpec

NOT_IN_CONCEPTS = OUTSIDE_CONCEPTS
OTHER_VISIT = "visit other than the index visit"
REJECTED_HERE = "rejected while building the frame"
DECEASED_UNDATED = "deceased, date of death unknown"
"""The cohort exclusion of a person the source says died (FHIR ``deceasedBoolean``), undated."""
OUTSIDE_WINDOW = "matched the study but not used (an earlier value, or outside the windows)"


@dataclass
class FrameResult:
    """The analysis frame and what happened to every represented record."""

    frame: pd.DataFrame
    record_status: pd.DataFrame  # record_type, status, reason, n
    cohort_exclusions: dict[str, int]
    conversions: list[dict] = field(default_factory=list)
    unvalidated_relied_on: list[str] = field(default_factory=list)
    """``record_ref`` of the unvalidated records the frame relies on (see the module docstring)."""


def build_frame(store: RecordStore, spec: StudySpec) -> FrameResult:
    """The analysis frame (one row per patient, indexed by ``person_id``) and record statuses.

    Everything that grows with the number of events -- matching codes to
    concept sets, the windows, unit conversion, plausibility checks, the
    last value, the classification of every record -- runs as DuckDB SQL
    inside the store; only per-patient tables reach pandas. Records this step
    rejects (implausible values, units that do not convert) are added to the
    store's ``rejected`` table with source ``harmonize``; calling it again
    replaces them.
    """
    con = store.connection
    con.execute(f"DELETE FROM rejected WHERE source = '{HARMONIZE}'")
    _create_matches(con, spec)
    con.execute("CREATE OR REPLACE TEMP TABLE _relied (record_ref VARCHAR)")
    try:
        persons = _persons(store)
        index = _index_dates(store, spec)
        _rely_on(con, index["index_ref"])
        cohort, exclusions = _cohort(persons, index, spec)
        _create_cohort_table(con, cohort)
        follow_up = _follow_up_end(store)
        _rely_on_follow_up_ends(con)
        _mark_used(con, pd.concat([cohort["record_ref"], cohort["index_ref"]]))
        conversions: list[dict] = []
        frame = pd.DataFrame(index=cohort.index)
        for covariate in spec.covariates:
            frame[covariate.name] = _covariate(con, covariate, cohort, conversions)
        outcome, outcome_exclusions = _outcome(con, cohort, follow_up, spec)
        for name, values in outcome.items():
            frame[name] = values
        keep = frame.index.isin(outcome.dropna().index)
        for reason, count in outcome_exclusions.items():
            exclusions[reason] = exclusions.get(reason, 0) + count
        frame = frame[keep]
        if spec.missing.policy == "drop":
            for covariate in spec.covariates:
                missing = frame[covariate.name].isna()
                if missing.any():
                    exclusions[f"missing {covariate.name}"] = int(missing.sum())
                    frame = frame[~missing]
        status = _record_status(store, frame.index)
        relied = _unvalidated_relied_on(con)
    finally:
        for table in _WORK_TABLES:
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute("DROP VIEW IF EXISTS _matched")
    return FrameResult(
        frame=frame[spec.columns()],
        record_status=status,
        cohort_exclusions=exclusions,
        conversions=conversions,
        unvalidated_relied_on=relied,
    )


# ----------------------------------------------------------------------------- pieces

HARMONIZE = "harmonize"
"""The ``source`` of the quarantine rows the frame builder adds."""

_WORK_TABLES = (
    "_concepts",
    "_cohort",
    "_used",
    "_relied",
    "_values",
    "_unit_factors",
    "_patients",
)


def _create_matches(con: duckdb.DuckDBPyConnection, spec: StudySpec) -> None:
    """``_concepts`` (the study's concept sets) and the view ``_matched`` of matching events.

    An event matches a set by ``(system, code)`` or by OMOP ``concept_id``;
    two hash joins, not one join on a disjunction, so matching stays linear
    in the number of events. ``_matched`` is a view: it is never held whole.
    An event matched by its code is not matched again by its concept id
    (an anti-join, not a ``UNION`` that would sort every matched row each
    time the view is read); two identical rows of one record (a coding
    written twice) both appear, and every query below is indifferent to
    repeated rows (it takes the first row per person, distinct records or
    persons, or a ``DISTINCT`` quarantine).
    """
    con.register("_concept_rows", _concept_table(spec))
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _concepts AS SELECT DISTINCT * FROM _concept_rows"
        )
    finally:
        con.unregister("_concept_rows")
    columns = (
        "e.person_id, e.domain, e.event_date, e.value, e.unit, e.record_ref, "
        "e.code, e.concept_id, c.set_name"
    )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW _matched AS
        SELECT {columns} FROM events e
          JOIN _concepts c ON e.system = c.system AND e.code = c.code
        UNION ALL
        SELECT {columns} FROM events e
          JOIN _concepts c ON e.concept_id = c.concept_id
        WHERE NOT EXISTS (SELECT 1 FROM _concepts d WHERE d.set_name = c.set_name
                          AND d.system = e.system AND d.code = e.code)
        """
    )


def _concept_table(spec: StudySpec) -> pd.DataFrame:
    rows = []
    for name, concept_set in spec.concept_sets.items():
        for system, code in concept_set.codings():
            rows.append({"set_name": name, "system": system, "code": code, "concept_id": None})
        for concept_id in concept_set.omop:
            rows.append({"set_name": name, "system": None, "code": None, "concept_id": concept_id})
    return pd.DataFrame(rows, columns=["set_name", "system", "code", "concept_id"]).astype(
        {"concept_id": "Int64"}
    )


def _persons(store: RecordStore) -> pd.DataFrame:
    persons = store.frame(
        """
        SELECT p.person_id, min(p.birth_date) AS birth_date, min(p.sex) AS sex,
               least(min(p.death_date), min(d.event_date)) AS death_date,
               coalesce(bool_or(p.deceased), false) AS deceased,
               min(p.record_ref) AS record_ref
        FROM persons p
        LEFT JOIN (SELECT person_id, event_date FROM events WHERE domain = 'death') d
          USING (person_id)
        GROUP BY p.person_id
        ORDER BY p.person_id
        """
    )
    return persons.set_index("person_id")


def _index_dates(store: RecordStore, spec: StudySpec) -> pd.DataFrame:
    cohort = spec.cohort
    if cohort.index == "first_visit":
        sql = """
            SELECT person_id, event_date AS index_date, record_ref AS index_ref
            FROM events WHERE domain = 'visit' AND event_date BETWEEN ? AND ?
            QUALIFY row_number() OVER (PARTITION BY person_id
                                       ORDER BY event_date, record_ref) = 1
        """
        parameters = [cohort.entry_start, cohort.entry_end]
    else:
        sql = """
            SELECT person_id, event_date AS index_date, record_ref AS index_ref
            FROM _matched
            WHERE domain = 'condition' AND set_name = ? AND event_date BETWEEN ? AND ?
            QUALIFY row_number() OVER (PARTITION BY person_id
                                       ORDER BY event_date, record_ref) = 1
        """
        parameters = [cohort.index_concepts, cohort.entry_start, cohort.entry_end]
    return store.frame(sql, parameters).set_index("person_id")


def _cohort(
    persons: pd.DataFrame, index: pd.DataFrame, spec: StudySpec
) -> tuple[pd.DataFrame, dict[str, int]]:
    cohort = persons.join(index, how="left")
    reasons = pd.Series(pd.NA, index=cohort.index, dtype="object")
    birth = pd.to_datetime(cohort["birth_date"])
    start = pd.to_datetime(cohort["index_date"])
    age = (start - birth).dt.days / 365.25
    reasons[birth.isna()] = "birth date unknown"
    reasons[reasons.isna() & start.isna()] = "no index event in the entry window"
    low, high = spec.cohort.min_age, spec.cohort.max_age
    outside = reasons.isna() & ~age.between(low, high + 1 - 1e-9)
    reasons[outside] = f"age at index outside [{low}, {high}]"
    death = pd.to_datetime(cohort["death_date"])
    died_before = reasons.isna() & (death < start)
    reasons[died_before] = "died before the index date"
    undated = reasons.isna() & cohort["deceased"].astype(bool) & death.isna()
    reasons[undated] = DECEASED_UNDATED
    cohort["age"] = age
    cohort["exclusion"] = reasons
    exclusions = {str(k): int(v) for k, v in reasons.dropna().value_counts().items()}
    return cohort[reasons.isna()].copy(), exclusions


def _create_cohort_table(con: duckdb.DuckDBPyConnection, cohort: pd.DataFrame) -> None:
    """``_cohort(person_id, index_date)`` and an empty ``_used(record_ref)``."""
    rows = pd.DataFrame(
        {"person_id": cohort.index.astype(object), "index_date": cohort["index_date"]}
    )
    con.register("_cohort_rows", rows)
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _cohort AS "
            "SELECT CAST(person_id AS VARCHAR) AS person_id, "
            "CAST(index_date AS DATE) AS index_date FROM _cohort_rows"
        )
    finally:
        con.unregister("_cohort_rows")
    con.execute("CREATE OR REPLACE TEMP TABLE _used (record_ref VARCHAR)")


def _add_refs(con: duckdb.DuckDBPyConnection, table: str, refs: pd.Series) -> None:
    """Add record references (from pandas) to the temporary table ``table``."""
    rows = pd.DataFrame({"record_ref": refs.dropna().astype(object)})
    con.register("_ref_rows", rows)
    try:
        con.execute(f"INSERT INTO {table} SELECT CAST(record_ref AS VARCHAR) FROM _ref_rows")
    finally:
        con.unregister("_ref_rows")


def _mark_used(con: duckdb.DuckDBPyConnection, refs: pd.Series) -> None:
    """Add record references to ``_used``: records the frame took."""
    _add_refs(con, "_used", refs)


def _rely_on(con: duckdb.DuckDBPyConnection, refs: pd.Series) -> None:
    """Add record references to ``_relied``: unvalidated records the frame relies on."""
    _add_refs(con, "_relied", refs)


def _rely_on_follow_up_ends(con: duckdb.DuckDBPyConnection) -> None:
    """The unvalidated records on the last day of a cohort member's follow-up without a period."""
    con.execute(
        """
        INSERT INTO _relied
        SELECT e.record_ref FROM events e
        JOIN (SELECT person_id, max(event_date) AS last_day FROM events GROUP BY person_id) m
          USING (person_id)
        WHERE e.unvalidated AND e.event_date = m.last_day
          AND e.person_id IN (SELECT person_id FROM _cohort)
          AND e.person_id NOT IN (SELECT person_id FROM periods WHERE end_date IS NOT NULL)
        """
    )


def _unvalidated_relied_on(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The unvalidated records used, quarantined here or otherwise relied on, in order."""
    rows = con.execute(
        f"""
        SELECT DISTINCT record_ref FROM events
        WHERE unvalidated AND record_ref IN (
            SELECT record_ref FROM _relied
            UNION ALL SELECT record_ref FROM _used
            UNION ALL SELECT location FROM rejected WHERE source = '{HARMONIZE}')
        ORDER BY record_ref
        """
    ).fetchall()
    return [ref for (ref,) in rows]


def _follow_up_end(store: RecordStore) -> pd.Series:
    ends = store.frame(
        """
        SELECT person_id, coalesce(max(p_end), max(e_end)) AS end_date FROM (
            SELECT person_id, end_date AS p_end, NULL::DATE AS e_end FROM periods
            UNION ALL
            SELECT person_id, NULL::DATE, event_date FROM events
        ) GROUP BY person_id
        """
    )
    return pd.to_datetime(ends.set_index("person_id")["end_date"])


def _window(covariate: Covariate) -> tuple[str, list]:
    """SQL for the cohort's matched events of ``covariate``'s set within its window."""
    sql = """
        SELECT m.* FROM _matched m JOIN _cohort c USING (person_id)
        WHERE m.set_name = ? AND m.event_date <= c.index_date
    """
    parameters: list = [covariate.concepts]
    if covariate.lookback_days is not None:
        sql += " AND m.event_date > c.index_date - CAST(? AS INTEGER)"
        parameters.append(covariate.lookback_days)
    return sql, parameters


def _covariate(
    con: duckdb.DuckDBPyConnection,
    covariate: Covariate,
    cohort: pd.DataFrame,
    conversions: list[dict],
) -> pd.Series:
    if covariate.kind == "age_at_index":
        return cohort["age"].astype(float)
    if covariate.kind == "sex":
        levels = list(covariate.levels or ("female", "male"))
        values = cohort["sex"].where(cohort["sex"].isin(levels))
        return pd.Series(pd.Categorical(values, categories=levels), index=cohort.index)
    window, parameters = _window(covariate)
    if covariate.kind in ("condition_before", "medication_before"):
        domain = "condition" if covariate.kind == "condition_before" else "medication"
        rows = f"SELECT person_id, record_ref FROM ({window}) w WHERE domain = ?"
        con.execute(f"INSERT INTO _used SELECT record_ref FROM ({rows})", [*parameters, domain])
        people = con.execute(
            f"SELECT DISTINCT person_id FROM ({rows})", [*parameters, domain]
        ).fetchall()
        present = pd.Series(0, index=cohort.index, dtype=np.int64)
        present[present.index.isin([p for (p,) in people])] = 1
        return present
    return _last_value(con, covariate, cohort, window, parameters, conversions)


def _last_value(
    con: duckdb.DuckDBPyConnection,
    covariate: Covariate,
    cohort: pd.DataFrame,
    window: str,
    parameters: list,
    conversions: list[dict],
) -> pd.Series:
    """The last plausible value in the window, in the covariate's unit.

    Rows whose unit does not convert, and converted values outside the
    plausible range, are quarantined (one entry per record).
    """
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _values AS
        SELECT person_id, event_date, record_ref, code, concept_id,
               coalesce(unit, '') AS unit, value
        FROM ({window}) w WHERE domain = 'measurement' AND value IS NOT NULL
        """,
        parameters,
    )
    factors = _unit_factors(con, covariate, conversions)
    con.register("_unit_factor_rows", factors)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _unit_factors AS SELECT * FROM _unit_factor_rows")
    finally:
        con.unregister("_unit_factor_rows")
    con.execute(
        "INSERT INTO _relied SELECT v.record_ref FROM _values v "
        "JOIN _unit_factors f USING (unit) WHERE f.by_analyte"
    )
    low, high = covariate.range
    quarantine = f"""
        INSERT INTO rejected (source, location, record_type, record_id, field, reason, detail)
        SELECT DISTINCT '{HARMONIZE}', record_ref, 'measurement', record_ref, ?, reason, detail
        FROM (
            SELECT v.record_ref, f.reason, NULL AS detail
            FROM _values v JOIN _unit_factors f USING (unit)
            WHERE f.reason IS NOT NULL
            UNION ALL
            SELECT v.record_ref,
                   printf('implausible value (plausible range %g-%g %s)', ?::DOUBLE, ?::DOUBLE, ?),
                   printf('%g %s', v.value * f.scale + f.offset, ?)
            FROM _values v JOIN _unit_factors f USING (unit)
            WHERE f.reason IS NULL AND NOT (v.value * f.scale + f.offset BETWEEN ? AND ?)
        )
    """
    con.execute(
        quarantine,
        [covariate.name, low, high, covariate.unit, covariate.unit, low, high],
    )
    last = con.execute(
        """
        SELECT v.person_id, v.value * f.scale + f.offset AS value, v.record_ref
        FROM _values v JOIN _unit_factors f USING (unit)
        WHERE f.reason IS NULL AND v.value * f.scale + f.offset BETWEEN ? AND ?
        QUALIFY row_number() OVER (PARTITION BY v.person_id
                                   ORDER BY v.event_date DESC, v.record_ref DESC) = 1
        """,
        [low, high],
    ).df()
    _mark_used(con, last["record_ref"])
    values = pd.Series(np.nan, index=cohort.index, dtype=float)
    values.loc[last["person_id"]] = last["value"].to_numpy(dtype=float)
    return values


def _unit_factors(
    con: duckdb.DuckDBPyConnection, covariate: Covariate, conversions: list[dict]
) -> pd.DataFrame:
    """``unit, scale, offset, reason, by_analyte`` for every unit in ``_values``.

    ``reason``: why it fails; ``by_analyte``: the conversion needs the molar
    mass of the analyte the group's codes name (so every record of the unit
    bears on it).
    """
    groups = con.execute(
        """
        SELECT unit, list(DISTINCT code) FILTER (WHERE code IS NOT NULL),
               list(DISTINCT concept_id) FILTER (WHERE concept_id IS NOT NULL),
               count(DISTINCT record_ref)
        FROM _values GROUP BY unit ORDER BY unit
        """
    ).fetchall()
    rows = []
    for unit, codes, concept_ids, records in groups:
        analyte = units.analyte_for(codes=codes or [], concept_ids=concept_ids or [])
        try:
            if not unit:
                raise units.UnitError("no unit")
            scale, offset = units.factor(
                unit, covariate.unit, analyte.molar_mass if analyte else None
            )
        except units.UnitError as error:
            rows.append((unit, None, None, str(error), False))
            continue
        rows.append((unit, scale, offset, None, _by_analyte(unit, covariate.unit)))
        if (scale, offset) != (1.0, 0.0) or units.ucum(unit) != unit:
            conversions.append(
                {
                    "covariate": covariate.name,
                    "from": unit,
                    "to": covariate.unit,
                    "scale": scale,
                    "offset": offset,
                    "records": int(records),
                }
            )
    columns = ["unit", "scale", "offset", "reason", "by_analyte"]
    return pd.DataFrame(rows, columns=columns).astype(
        {"unit": object, "scale": float, "offset": float, "reason": object, "by_analyte": bool}
    )


def _by_analyte(unit: str, target: str) -> bool:
    """Whether converting ``unit`` to ``target`` needs an analyte's molar mass."""
    try:
        units.factor(unit, target)
    except units.UnitError:
        return True
    return False


def _outcome(
    con: duckdb.DuckDBPyConnection, cohort: pd.DataFrame, follow_up: pd.Series, spec: StudySpec
) -> tuple[pd.DataFrame, dict[str, int]]:
    outcome = spec.outcome
    index_date = pd.to_datetime(cohort["index_date"])
    if outcome.event == "death":
        event_date = pd.to_datetime(cohort["death_date"])
        refs = pd.Series(dtype=object)
    else:
        first = con.execute(
            """
            SELECT m.person_id, m.event_date, m.record_ref
            FROM _matched m JOIN _cohort c USING (person_id)
            WHERE m.set_name = ? AND m.event_date > c.index_date
            QUALIFY row_number() OVER (PARTITION BY m.person_id
                                       ORDER BY m.event_date, m.record_ref) = 1
            """,
            [outcome.event],
        ).df()
        first = first.set_index("person_id")
        event_date = pd.to_datetime(first["event_date"]).reindex(cohort.index)
        refs = first["record_ref"]
    end = follow_up.reindex(cohort.index)
    end = pd.concat([end, event_date], axis=1).max(axis=1)
    days_to_event = (event_date - index_date).dt.days
    days_to_end = (end - index_date).dt.days
    exclusions: dict[str, int] = {}
    result = pd.DataFrame(index=cohort.index)
    if outcome.kind == "binary":
        window = outcome.window_days
        event = days_to_event.between(1, window)
        complete = event | (days_to_end >= window)
        exclusions_count = int((~complete).sum())
        if exclusions_count:
            exclusions["follow-up shorter than the outcome window"] = exclusions_count
        result[outcome.name] = event.astype("Int64").where(complete)
        _mark_used(con, refs[refs.index.isin(event[event].index)])
    else:
        has_event = days_to_event.notna() & (days_to_event >= 0)
        time = days_to_event.where(has_event, days_to_end).astype(float)
        valid = time > 0
        if (~valid).sum():
            exclusions["no follow-up after the index date"] = int((~valid).sum())
        result[f"{outcome.name}_time"] = time.where(valid)
        result[outcome.name] = has_event.astype("Int64").where(valid)
        _mark_used(con, refs[refs.index.isin(has_event[has_event].index)])
    return result.dropna(), exclusions


def _record_status(store: RecordStore, patients: pd.Index) -> pd.DataFrame:
    """Classify every represented record: included, excluded (with reason), or rejected here.

    A record is rejected here when the frame builder quarantined it; else
    excluded when its patient is not in the frame; else included when used
    (or it is a person, period or death record); else excluded as another
    visit, as matched but not used, or as not in the concept sets.
    """
    con = store.connection
    rows = pd.DataFrame({"person_id": patients.astype(object)})
    con.register("_patient_rows", rows)
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _patients AS "
            "SELECT DISTINCT CAST(person_id AS VARCHAR) AS person_id FROM _patient_rows"
        )
    finally:
        con.unregister("_patient_rows")
    return store.frame(
        f"""
        WITH records AS (
            SELECT person_id, record_type, record_ref, 'person' AS kind, false AS matched
            FROM persons
            UNION ALL SELECT person_id, record_type, record_ref, 'period', false FROM periods
            UNION ALL SELECT e.person_id, e.record_type, e.record_ref, e.domain,
                EXISTS (SELECT 1 FROM _concepts c WHERE c.system = e.system AND c.code = e.code)
                OR EXISTS (SELECT 1 FROM _concepts c WHERE c.concept_id = e.concept_id)
            FROM events e
        ),
        per_record AS (
            SELECT r.record_ref, any_value(r.record_type) AS record_type,
                   bool_or(p.person_id IS NULL) AS outside_frame,
                   bool_or(r.kind IN ('person', 'period', 'death')) AS always_used,
                   bool_and(r.kind = 'visit') AS only_visit,
                   bool_or(r.matched) AS matched
            FROM records r LEFT JOIN _patients p ON r.person_id = p.person_id
            GROUP BY r.record_ref
        ),
        rejected_here AS (
            SELECT DISTINCT location AS ref FROM rejected WHERE source = '{HARMONIZE}'
        ),
        used AS (SELECT DISTINCT record_ref AS ref FROM _used),
        classified AS (
            SELECT r.record_type,
              CASE
                WHEN x.ref IS NOT NULL THEN '{REJECTED_HERE}'
                WHEN r.outside_frame THEN 'patient not in the analysis frame'
                WHEN u.ref IS NOT NULL OR r.always_used THEN NULL
                WHEN r.only_visit THEN '{OTHER_VISIT}'
                WHEN r.matched THEN '{OUTSIDE_WINDOW}'
                ELSE '{NOT_IN_CONCEPTS}' END AS reason
            FROM per_record r
            LEFT JOIN rejected_here x ON r.record_ref = x.ref
            LEFT JOIN used u ON r.record_ref = u.ref
        )
        SELECT record_type,
               CASE WHEN reason IS NULL THEN 'included'
                    WHEN reason = '{REJECTED_HERE}' THEN 'rejected'
                    ELSE 'excluded' END AS status,
               reason, count(*) AS n
        FROM classified GROUP BY ALL ORDER BY ALL
        """
    )


def coding_coverage(store: RecordStore) -> float:
    """Share of event rows carrying a code of a known terminology or an OMOP concept id."""
    systems = "', '".join(SYSTEMS.values())
    total, known = store.connection.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE system IN ('{systems}')
                                              OR coalesce(concept_id, 0) > 0)
            FROM events"""
    ).fetchall()[0]
    return float(known) / float(total) if total else 1.0
