"""The frame builder: cohort, outcome and covariate rules on a hand-made record store."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedstats
from harmonize.frame import NOT_IN_CONCEPTS, OTHER_VISIT, build_frame, coding_coverage
from harmonize.records import RecordStore
from harmonize.spec import parse_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
LOINC, SNOMED = "http://loinc.org", "http://snomed.info/sct"


def spec(**outcome):
    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"] = {
        "name": "died",
        "kind": "binary",
        "event": "death",
        "window_days": 365,
        **outcome,
    }
    return parse_spec(raw)


def person(pid, birth, sex, death=None):
    return {
        "person_id": pid,
        "birth_date": birth,
        "sex": sex,
        "death_date": death,
        "record_type": "Patient",
        "record_ref": f"patient:{pid}",
    }


def event(pid, ref, domain, date, system=None, code=None, value=None, unit=None, concept_id=None):
    return {
        "person_id": pid,
        "domain": domain,
        "system": system,
        "code": code,
        "concept_id": concept_id,
        "event_date": date,
        "value": value,
        "unit": unit,
        "record_type": domain,
        "record_ref": ref,
    }


@pytest.fixture()
def store():
    s = RecordStore()
    s.append(
        "persons",
        [
            person("a", "1950-01-01", "male", "2011-03-01"),
            person("b", "1960-06-01", "female"),
            person("c", "2010-01-01", "female"),
            person("d", "1940-01-01", "male"),
        ],
    )
    s.append(
        "events",
        [
            event("a", "v1", "visit", "2010-05-01"),
            event("a", "v2", "visit", "2010-09-01"),
            event("a", "m1", "measurement", "2009-05-01", LOINC, "8480-6", 140, "mm[Hg]"),
            event("a", "m2", "measurement", "2010-04-01", LOINC, "8480-6", 17.3, "kPa"),
            event("a", "c1", "condition", "2005-01-01", SNOMED, "44054006"),
            event("b", "v3", "visit", "2012-01-01"),
            event("b", "v4", "visit", "2014-01-01"),
            event("b", "m3", "measurement", "2011-12-01", LOINC, "8480-6", 400, "mm[Hg]"),
            event(
                "b", "m4", "measurement", "2011-12-01", None, None, 31, "kg/m2", concept_id=3038553
            ),
            event("b", "m5", "measurement", "2011-12-01", LOINC, "9999-9", 1, "kg"),
            event("b", "rx", "medication", "2011-06-01", None, None, concept_id=1539463),
            event("c", "v5", "visit", "2015-01-01"),
            event("d", "v6", "visit", "2015-01-01"),  # follow-up ends at the index
        ],
    )
    return s


def test_frame_follows_the_rules(store):
    result = build_frame(store, spec())
    frame = result.frame
    assert list(frame.index) == ["a", "b"]
    assert list(frame.columns) == [
        "age",
        "sex",
        "sbp",
        "bmi",
        "diabetes",
        "hypertension",
        "statin",
        "died",
    ]
    a, b = frame.loc["a"], frame.loc["b"]
    assert a["age"] == pytest.approx(
        (pd.Timestamp("2010-05-01") - pd.Timestamp("1950-01-01")).days / 365.25
    )
    assert a["sbp"] == pytest.approx(17.3 * 7.500615758456563)  # kPa -> mm[Hg], last value
    assert a["diabetes"] == 1 and a["died"] == 1  # died 304 days after the index
    assert np.isnan(b["sbp"])  # 400 mm[Hg] is implausible: rejected
    assert b["bmi"] == 31 and b["statin"] == 1 and b["died"] == 0
    assert str(a["sex"]) == "male" and list(frame["sex"].cat.categories) == ["female", "male"]
    assert result.cohort_exclusions == {
        "age at index outside [18, 110]": 1,
        "follow-up shorter than the outcome window": 1,
    }
    assert result.conversions == [
        {
            "covariate": "sbp",
            "from": "kPa",
            "to": "mm[Hg]",
            "scale": pytest.approx(7.500615758456563),
            "offset": 0.0,
            "records": 1,
        }
    ]


def test_every_record_is_classified_once(store):
    result = build_frame(store, spec())
    status = result.record_status
    assert status["n"].sum() == 4 + 13  # persons + events, one status each
    by = {(r.status, r.reason): r.n for r in status.itertuples()}
    assert by[("rejected", "rejected while building the frame")] == 1  # m3
    assert by[("excluded", NOT_IN_CONCEPTS)] == 1  # m5
    assert by[("excluded", OTHER_VISIT)] == 2  # v2 and v4: not the index visits
    quarantine = store.table("rejected")
    assert list(quarantine["location"]) == ["m3"]
    # the reason is the same for every implausible sbp value; the value is the detail
    assert quarantine["reason"].iloc[0] == "implausible value (plausible range 50-260 mm[Hg])"
    assert quarantine["detail"].iloc[0] == "400 mm[Hg]"


def test_time_to_event_outcome(store):
    result = build_frame(store, spec(kind="time_to_event", window_days=None))
    frame = result.frame
    assert (
        frame.loc["a", "died_time"]
        == (pd.Timestamp("2011-03-01") - pd.Timestamp("2010-05-01")).days
    )
    assert frame.loc["a", "died"] == 1
    assert (
        frame.loc["b", "died_time"]
        == (pd.Timestamp("2014-01-01") - pd.Timestamp("2012-01-01")).days
    )
    assert frame.loc["b", "died"] == 0
    assert "d" not in frame.index  # no follow-up after the index
    assert result.cohort_exclusions["no follow-up after the index date"] == 1


def test_missing_policy_drop(store):
    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"]["window_days"] = 365
    raw["missing"] = {"policy": "drop"}
    result = build_frame(store, parse_spec(raw))
    assert list(result.frame.index) == []  # a lacks bmi, b lacks sbp
    assert result.cohort_exclusions["missing sbp"] == 1


def test_coding_coverage(store):
    assert coding_coverage(store) == pytest.approx(7 / 13)


def test_mismatched_fingerprints_stop_a_federation_before_any_task():
    frames = {}
    for name, unit in [("north", "mm[Hg]"), ("south", "kPa")]:
        frame = pd.DataFrame({"sbp": [120.0] * 20, "y": [0, 1] * 10})
        fingerprint = fedstats_fingerprint(frame, unit)
        frame.attrs["fingerprint"] = fingerprint
        frames[name] = frame
    with pytest.raises(
        fedstats.FingerprintMismatchError, match=r"site 'south'.*'sbp': unit 'kPa' vs 'mm\[Hg\]'"
    ):
        fedstats.Federation.in_process(frames)
    same = {n: f.copy() for n, f in frames.items()}
    same["south"].attrs["fingerprint"] = copy.deepcopy(frames["north"].attrs["fingerprint"])
    fed = fedstats.Federation.in_process(same)
    assert len(fed.inventory) == 0
    unharmonised = {"north": frames["north"], "west": pd.DataFrame({"sbp": [1.0], "y": [0]})}
    with pytest.raises(fedstats.FingerprintMismatchError, match=r"\['west'\] have no"):
        fedstats.Federation.in_process(unharmonised)


def fedstats_fingerprint(frame, unit):
    from harmonize.fingerprint import fingerprint_frame

    return fingerprint_frame(frame, units={"sbp": unit}, spec_digest="d" * 64).as_record()


def test_remote_sites_are_asked_for_fingerprints_before_the_first_task():
    """Through transports only (as over a network), the check runs as a task of its own."""
    silos = {}
    for name, unit in [("north", "mm[Hg]"), ("south", "kPa")]:
        frame = pd.DataFrame({"sbp": [120.0, 130.0] * 10, "y": [0, 1] * 10})
        frame.attrs["fingerprint"] = fedstats_fingerprint(frame, unit)
        silos[name] = fedstats.Silo(name, frame)
    fed = fedstats.Federation(
        {name: silo.handle for name, silo in silos.items()}, verify_fingerprints=True
    )
    model = fedstats.LogisticRegression("y ~ sbp")
    with pytest.raises(fedstats.FingerprintMismatchError, match=r"'sbp': unit 'kPa'"):
        model.fit(fed)
    assert {r.task for r in fed.inventory.records()} == {"harmonize.fingerprint"}

    # A frame edited after harmonisation no longer matches what it declares.
    north = silos["north"]
    south_frame = pd.DataFrame({"sbp": [120.0, 130.0] * 10, "y": [0, 1] * 10})
    south_frame.attrs["fingerprint"] = fedstats_fingerprint(south_frame, "mm[Hg]")
    south_frame["extra"] = 1.0
    fed = fedstats.Federation(
        {"north": north.handle, "south": fedstats.Silo("south", south_frame).handle},
        verify_fingerprints=True,
    )
    with pytest.raises(fedstats.FingerprintMismatchError, match=r"'extra' only in"):
        fed.verify_fingerprints()

    # Equal fingerprints: the fit goes ahead, after one fingerprint exchange.
    same = pd.DataFrame({"sbp": [121.0, 131.0] * 10, "y": [1, 0] * 10})
    same.attrs["fingerprint"] = fedstats_fingerprint(same, "mm[Hg]")
    fed = fedstats.Federation(
        {"north": north.handle, "south": fedstats.Silo("south", same).handle},
        verify_fingerprints=True,
    )
    model.fit(fed)
    tasks = [r.task for r in fed.inventory.records()]
    assert tasks[:2] == ["harmonize.fingerprint"] * 2
    assert tasks.count("harmonize.fingerprint") == 2
