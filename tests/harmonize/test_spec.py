"""The study specification: the demo spec loads; every kind of mistake is named by field."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonize.errors import SpecError
from harmonize.spec import SYSTEMS, load_spec, parse_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"


@pytest.fixture(scope="module")
def raw() -> dict:
    return tomllib.loads(DEMO.read_text())


def test_demo_spec_loads_with_its_columns():
    spec = load_spec(DEMO)
    assert spec.study.name == "demo_mortality"
    assert spec.columns() == [
        "age",
        "sex",
        "sbp",
        "bmi",
        "diabetes",
        "hypertension",
        "statin",
        "died",
    ]
    assert ("http://loinc.org", "8480-6") in spec.concept_sets["systolic_bp"].codings()
    assert spec.concept_sets["systolic_bp"].omop == (3004249,)


def test_digest_ignores_layout_and_changes_with_content(raw, tmp_path):
    assert parse_spec(copy.deepcopy(raw)).digest == load_spec(DEMO).digest
    changed = copy.deepcopy(raw)
    changed["covariates"][2]["range"] = [40, 260]
    assert parse_spec(changed).digest != load_spec(DEMO).digest


def test_time_to_event_outcome_adds_a_time_column(raw):
    changed = copy.deepcopy(raw)
    changed["outcome"] = {"name": "death", "kind": "time_to_event", "event": "death"}
    assert parse_spec(changed).columns()[-2:] == ["death_time", "death"]


@pytest.mark.parametrize(
    ("mutate", "where", "message"),
    [
        (lambda r: r["cohort"].update(entry_end="1900-01-01"), "cohort", "entry_end is before"),
        (lambda r: r["cohort"].update(max_age=10), "cohort", "max_age is below min_age"),
        (lambda r: r["cohort"].update(index="first_condition"), "cohort", "index_concepts"),
        (lambda r: r["outcome"].pop("window_days"), "outcome", "needs window_days"),
        (lambda r: r["outcome"].update(kind="count"), "outcome.kind", "'binary'"),
        (lambda r: r["covariates"][2].pop("unit"), "covariates.2", "UCUM unit"),
        (lambda r: r["covariates"][2].update(range=[5, 1]), "covariates.2", "low < high"),
        (
            lambda r: r["covariates"][4].update(concepts="nowhere"),
            "(top level)",
            "not defined under [concept_sets]: ['nowhere']",
        ),
        (lambda r: r["covariates"][0].update(colour="red"), "covariates.0.colour", "Extra inputs"),
        (
            lambda r: r["covariates"][1].update(levels=["female", "female"]),
            "covariates.1",
            "distinct",
        ),
        (
            lambda r: r["covariates"].append({"name": "age", "kind": "age_at_index"}),
            "(top level)",
            "used twice",
        ),
        (
            lambda r: (
                r["concept_sets"]["bmi"].update(loinc=[]) or r["concept_sets"]["bmi"].pop("omop")
            ),
            "concept_sets.bmi",
            "at least one code",
        ),
        (
            lambda r: r["concept_sets"]["bmi"].update(loinc=["39156 5"]),
            "concept_sets.bmi.loinc.0",
            "pattern",
        ),
        (lambda r: r.pop("cohort"), "cohort", "Field required"),
    ],
)
def test_mistakes_are_named_by_field(raw, mutate, where, message):
    bad = copy.deepcopy(raw)
    mutate(bad)
    with pytest.raises(SpecError) as info:
        parse_spec(bad, source="study.toml")
    text = str(info.value)
    assert text.startswith("study.toml: invalid study specification")
    assert any(p.startswith(where) and message in p for p in info.value.problems), text


def test_unreadable_files_name_the_path(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[study\nname = 1")
    with pytest.raises(SpecError, match=r"broken\.toml: not valid TOML"):
        load_spec(broken)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=8), children, max_size=3)
        ),
        max_leaves=15,
    ),
    st.sampled_from(["study", "cohort", "outcome", "covariates", "concept_sets", "missing"]),
)
@settings(max_examples=200, deadline=None)
def test_any_malformed_section_is_a_spec_error(value, section):
    raw = tomllib.loads(DEMO.read_text())
    raw[section] = value
    try:
        parse_spec(raw)
    except SpecError as error:
        assert error.problems
    # some values (e.g. an empty missing-policy table) are valid


def test_systems_are_fhir_uris():
    assert SYSTEMS["loinc"] == "http://loinc.org"
    assert SYSTEMS["snomed"] == "http://snomed.info/sct"
