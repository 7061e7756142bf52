"""Build the analysis frame a study specification defines from a site's record store.

The same rules apply whatever the source (FHIR or OMOP), because they read
only the :class:`~harmonize.records.RecordStore`:

* **index**: the first visit (or first condition in the index concept set)
  within ``[entry_start, entry_end]``;
* **cohort**: a known birth date, an index event, age at index within
  ``[min_age, max_age]``, alive at the index date;
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

Concept sets match a record by ``(system, code)`` or by OMOP ``concept_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harmonize import units
from harmonize.records import RecordStore
from harmonize.spec import SYSTEMS, Covariate, StudySpec

NOT_IN_CONCEPTS = "code not in the concept sets of the study"
OTHER_VISIT = "visit other than the index visit"
REJECTED_HERE = "rejected while building the frame"
OUTSIDE_WINDOW = "matched the study but not used (an earlier value, or outside the windows)"


@dataclass
class FrameResult:
    """The analysis frame and what happened to every represented record."""

    frame: pd.DataFrame
    record_status: pd.DataFrame  # record_type, status, reason, n
    cohort_exclusions: dict[str, int]
    conversions: list[dict] = field(default_factory=list)


def build_frame(store: RecordStore, spec: StudySpec) -> FrameResult:
    """The analysis frame (one row per patient, indexed by ``person_id``) and record statuses."""
    con = store.connection
    con.register("_concepts", _concept_table(spec))
    try:
        persons = _persons(store)
        index = _index_dates(store, spec)
        cohort, exclusions = _cohort(persons, index, spec)
        follow_up = _follow_up_end(store)
        matched = _matched_events(store)
        used: set[str] = set(cohort["record_ref"].dropna())
        used |= set(cohort["index_ref"].dropna())
        rejected_here: list[dict] = []
        conversions: list[dict] = []
        frame = pd.DataFrame(index=cohort.index)
        for covariate in spec.covariates:
            column, refs = _covariate(covariate, cohort, matched, spec, rejected_here, conversions)
            frame[covariate.name] = column
            used |= refs
        outcome, outcome_refs, outcome_exclusions = _outcome(cohort, matched, follow_up, spec)
        for name, values in outcome.items():
            frame[name] = values
        used |= outcome_refs
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
        used_patients = set(frame.index)
        for row in rejected_here:
            store.reject(**row)
        status = _record_status(store, used, used_patients, {r["location"] for r in rejected_here})
    finally:
        con.unregister("_concepts")
    return FrameResult(
        frame=frame[spec.columns()],
        record_status=status,
        cohort_exclusions=exclusions,
        conversions=conversions,
    )


# ----------------------------------------------------------------------------- pieces


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
               min(p.record_ref) AS record_ref
        FROM persons p
        LEFT JOIN (SELECT person_id, event_date FROM events WHERE domain = 'death') d
          USING (person_id)
        GROUP BY p.person_id
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
        sql = f"""
            SELECT person_id, event_date AS index_date, record_ref AS index_ref
            FROM ({_MATCH_SQL}) m
            WHERE domain = 'condition' AND set_name = ? AND event_date BETWEEN ? AND ?
            QUALIFY row_number() OVER (PARTITION BY person_id
                                       ORDER BY event_date, record_ref) = 1
        """
        parameters = [cohort.index_concepts, cohort.entry_start, cohort.entry_end]
    return store.frame(sql, parameters).set_index("person_id")


_MATCH_SQL = """
    SELECT DISTINCT e.person_id, e.domain, e.event_date, e.value, e.unit, e.record_ref,
           e.code, e.concept_id, c.set_name
    FROM events e
    JOIN _concepts c
      ON (c.system IS NOT NULL AND e.system = c.system AND e.code = c.code)
      OR (c.concept_id IS NOT NULL AND e.concept_id = c.concept_id)
"""


def _matched_events(store: RecordStore) -> pd.DataFrame:
    return store.frame(_MATCH_SQL)


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
    died_before = reasons.isna() & (pd.to_datetime(cohort["death_date"]) < start)
    reasons[died_before] = "died before the index date"
    cohort["age"] = age
    cohort["exclusion"] = reasons
    exclusions = {str(k): int(v) for k, v in reasons.dropna().value_counts().items()}
    return cohort[reasons.isna()].copy(), exclusions


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


def _covariate(
    covariate: Covariate,
    cohort: pd.DataFrame,
    matched: pd.DataFrame,
    spec: StudySpec,
    rejected: list[dict],
    conversions: list[dict],
) -> tuple[pd.Series, set[str]]:
    index_date = pd.to_datetime(cohort["index_date"])
    if covariate.kind == "age_at_index":
        return cohort["age"].astype(float), set()
    if covariate.kind == "sex":
        levels = list(covariate.levels or ("female", "male"))
        values = cohort["sex"].where(cohort["sex"].isin(levels))
        return pd.Series(pd.Categorical(values, categories=levels), index=cohort.index), set()
    rows = matched[
        (matched["set_name"] == covariate.concepts) & matched["person_id"].isin(cohort.index)
    ].copy()
    rows["event_date"] = pd.to_datetime(rows["event_date"])
    rows["index_date"] = rows["person_id"].map(index_date)
    window = rows["event_date"] <= rows["index_date"]
    if covariate.lookback_days is not None:
        earliest = rows["index_date"] - pd.Timedelta(days=covariate.lookback_days)
        window &= rows["event_date"] > earliest
    rows = rows[window]
    if covariate.kind in ("condition_before", "medication_before"):
        domain = "condition" if covariate.kind == "condition_before" else "medication"
        rows = rows[rows["domain"] == domain]
        present = pd.Series(0, index=cohort.index, dtype=np.int64)
        present[present.index.isin(rows["person_id"])] = 1
        return present, set(rows["record_ref"])
    rows = rows[(rows["domain"] == "measurement") & rows["value"].notna()]
    rows = _to_spec_unit(rows, covariate, rejected, conversions)
    low, high = covariate.range
    implausible = ~rows["value"].between(low, high)
    for _, row in rows[implausible].iterrows():
        rejected.append(
            {
                "source": "harmonize",
                "location": row["record_ref"],
                "record_type": "measurement",
                "record_id": row["record_ref"],
                "field": covariate.name,
                "reason": f"implausible value {row['value']:g} {covariate.unit} "
                f"(plausible range {low:g}-{high:g})",
            }
        )
    rows = rows[~implausible].sort_values(["person_id", "event_date", "record_ref"])
    last = rows.groupby("person_id").tail(1).set_index("person_id")
    values = pd.Series(np.nan, index=cohort.index, dtype=float)
    values.loc[last.index] = last["value"]
    return values, set(last["record_ref"])


def _to_spec_unit(
    rows: pd.DataFrame, covariate: Covariate, rejected: list[dict], conversions: list[dict]
) -> pd.DataFrame:
    """Convert every row's value to the covariate's unit; reject rows whose unit cannot be."""
    rows = rows.copy()
    rows["unit"] = rows["unit"].fillna("")
    keep = pd.Series(True, index=rows.index)
    for unit, group in rows.groupby("unit"):
        analyte = units.analyte_for(
            codes=group["code"].dropna(), concept_ids=group["concept_id"].dropna().astype(int)
        )
        try:
            if not unit:
                raise units.UnitError("no unit")
            scale, offset = units.factor(
                unit, covariate.unit, analyte.molar_mass if analyte else None
            )
        except units.UnitError as error:
            keep[group.index] = False
            for ref in group["record_ref"]:
                rejected.append(
                    {
                        "source": "harmonize",
                        "location": ref,
                        "record_type": "measurement",
                        "record_id": ref,
                        "field": covariate.name,
                        "reason": str(error),
                    }
                )
            continue
        rows.loc[group.index, "value"] = group["value"] * scale + offset
        if (scale, offset) != (1.0, 0.0) or units.ucum(unit) != unit:
            conversions.append(
                {
                    "covariate": covariate.name,
                    "from": unit,
                    "to": covariate.unit,
                    "scale": scale,
                    "offset": offset,
                    "records": len(group),
                }
            )
    return rows[keep]


def _outcome(
    cohort: pd.DataFrame, matched: pd.DataFrame, follow_up: pd.Series, spec: StudySpec
) -> tuple[pd.DataFrame, set[str], dict[str, int]]:
    outcome = spec.outcome
    index_date = pd.to_datetime(cohort["index_date"])
    if outcome.event == "death":
        event_date = pd.to_datetime(cohort["death_date"])
        refs = pd.Series(dtype=object)
    else:
        rows = matched[
            (matched["set_name"] == outcome.event) & matched["person_id"].isin(cohort.index)
        ].copy()
        rows["event_date"] = pd.to_datetime(rows["event_date"])
        rows = rows[rows["event_date"] > rows["person_id"].map(index_date)]
        first = rows.sort_values(["event_date", "record_ref"]).groupby("person_id").head(1)
        first = first.set_index("person_id")
        event_date = first["event_date"].reindex(cohort.index)
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
        used = set(refs[refs.index.isin(event[event].index)])
    else:
        has_event = days_to_event.notna() & (days_to_event >= 0)
        time = days_to_event.where(has_event, days_to_end).astype(float)
        valid = time > 0
        if (~valid).sum():
            exclusions["no follow-up after the index date"] = int((~valid).sum())
        result[f"{outcome.name}_time"] = time.where(valid)
        result[outcome.name] = has_event.astype("Int64").where(valid)
        used = set(refs[refs.index.isin(has_event[has_event].index)])
    return result.dropna(), used, exclusions


def _record_status(
    store: RecordStore, used: set[str], patients: set[str], rejected_refs: set[str]
) -> pd.DataFrame:
    """Classify every represented record: included, excluded (with reason), or rejected here."""
    con = store.connection
    con.register("_used", pd.DataFrame({"record_ref": sorted(used)}, dtype=object))
    con.register(
        "_rejected_here", pd.DataFrame({"record_ref": sorted(rejected_refs)}, dtype=object)
    )
    con.register("_patients", pd.DataFrame({"person_id": sorted(patients)}, dtype=object))
    try:
        status = store.frame(
            f"""
            WITH records AS (
                SELECT person_id, record_type, record_ref, 'person' AS kind FROM persons
                UNION ALL SELECT person_id, record_type, record_ref, 'period' FROM periods
                UNION ALL SELECT person_id, record_type, record_ref, domain FROM events
            ),
            matched AS (SELECT DISTINCT record_ref FROM ({_MATCH_SQL}) m),
            classified AS (
                SELECT r.record_ref, any_value(r.record_type) AS record_type,
                  CASE
                    WHEN bool_or(r.record_ref IN (SELECT record_ref FROM _rejected_here))
                      THEN '{REJECTED_HERE}'
                    WHEN bool_or(r.person_id NOT IN (SELECT person_id FROM _patients))
                      THEN 'patient not in the analysis frame'
                    WHEN bool_or(r.record_ref IN (SELECT record_ref FROM _used))
                         OR bool_or(r.kind IN ('person', 'period', 'death'))
                      THEN NULL
                    WHEN bool_and(r.kind = 'visit') THEN '{OTHER_VISIT}'
                    WHEN bool_or(r.record_ref IN (SELECT record_ref FROM matched))
                      THEN '{OUTSIDE_WINDOW}'
                    ELSE '{NOT_IN_CONCEPTS}' END AS reason
                FROM records r GROUP BY r.record_ref
            )
            SELECT record_type,
                   CASE WHEN reason IS NULL THEN 'included'
                        WHEN reason = '{REJECTED_HERE}' THEN 'rejected'
                        ELSE 'excluded' END AS status,
                   reason, count(*) AS n
            FROM classified GROUP BY ALL ORDER BY ALL
            """
        )
    finally:
        for name in ("_used", "_rejected_here", "_patients"):
            con.unregister(name)
    return status


def coding_coverage(store: RecordStore) -> float:
    """Share of event rows carrying a code of a known terminology or an OMOP concept id."""
    systems = "', '".join(SYSTEMS.values())
    total, known = store.connection.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE system IN ('{systems}')
                                              OR coalesce(concept_id, 0) > 0)
            FROM events"""
    ).fetchall()[0]
    return float(known) / float(total) if total else 1.0
