"""The study spec's ``[linkage]`` and ``[identifiers]`` tables: kept as written, frozen,
checked by type with the field named, and part of the spec digest."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonize.errors import SpecError
from harmonize.spec import load_spec, parse_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
LINKAGE_TOML = """
[linkage]
fields = [
  { name = "given_name",  ngram = 2, bits = 200 },
  { name = "family_name", ngram = 2, bits = 200 },
  { name = "birth_date",  ngram = 1, bits = 100, positional = true },
  { name = "sex",         ngram = 1, bits = 30,  positional = true },
  { name = "postal_code", ngram = 1, bits = 60,  positional = true },
]
length = 1024
threshold = 0.8
blocking = "soundex"
"""


@pytest.fixture
def raw() -> dict:
    return tomllib.loads(DEMO.read_text())


def test_linkage_table_is_kept_as_written(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text(DEMO.read_text() + LINKAGE_TOML)
    spec = load_spec(path)
    written = tomllib.loads(LINKAGE_TOML)["linkage"]
    assert set(spec.linkage) == set(written)
    assert {k: v for k, v in spec.linkage.items() if k != "fields"} == {
        k: v for k, v in written.items() if k != "fields"
    }
    assert len(spec.linkage["fields"]) == 5  # arrays are kept as tuples
    assert spec.linkage["fields"][3] == {"name": "sex", "ngram": 1, "bits": 30, "positional": True}
    assert spec.model_dump(mode="json")["linkage"] == written
    assert spec.identifiers is None


def test_linkage_table_cannot_be_changed(raw):
    raw["linkage"] = tomllib.loads(LINKAGE_TOML)["linkage"]
    spec = parse_spec(raw)
    before = spec.digest
    with pytest.raises(TypeError):
        spec.linkage["threshold"] = 0.1  # type: ignore[index]
    with pytest.raises(TypeError):
        spec.linkage["fields"][0]["bits"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.linkage["fields"].append({})  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="frozen"):
        spec.linkage = {}  # type: ignore[misc]
    raw["linkage"]["threshold"] = 0.1  # the mapping it was read from
    assert spec.linkage["threshold"] == 0.8 and spec.digest == before
    for copied in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert copied == spec and copied.digest == before
    assert parse_spec(json.loads(json.dumps(spec.model_dump(mode="json")))) == spec


def test_a_spec_without_linkage_keeps_its_digest(raw):
    """The digest of a spec without the new tables is the SHA-256 of its JSON form as it was
    computed before they existed (every other field, sorted keys, no spaces)."""
    spec = parse_spec(raw)
    dumped = spec.model_dump(mode="json")
    assert dumped.pop("linkage") is None and dumped.pop("identifiers") is None
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    assert spec.digest == hashlib.sha256(canonical.encode()).hexdigest()


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | st.booleans(),
        min_size=1,
        max_size=4,
    )
)
def test_every_linkage_table_changes_the_digest_and_is_told_apart(table):
    raw = tomllib.loads(DEMO.read_text())
    plain = parse_spec(raw).digest
    raw["linkage"] = {"length": 1024, **table}
    first = parse_spec(raw)
    assert first.digest != plain
    raw["linkage"] = {"length": 1024, **table, "extra": "x" if table.get("extra") != "x" else "y"}
    assert parse_spec(raw).digest != first.digest


@pytest.mark.parametrize("wrong", [5, "soundex", [1, 2], True])
def test_linkage_of_a_wrong_type_is_named(raw, wrong):
    raw["linkage"] = wrong
    with pytest.raises(SpecError) as error:
        parse_spec(raw, source="study.toml")
    assert "study.toml" in str(error.value)
    assert any(p.startswith("linkage:") for p in error.value.problems), error.value.problems


def test_identifiers_table_is_checked_and_needs_linkage(raw):
    raw["identifiers"] = {"omop_names": "person_source_value"}
    with pytest.raises(SpecError, match=r"\[identifiers\] is used only with a \[linkage\] table"):
        parse_spec(raw)
    raw["linkage"] = {"length": 1024}
    spec = parse_spec(raw)
    assert spec.identifiers.omop_names == "person_source_value"
    raw_without = {k: v for k, v in raw.items() if k != "identifiers"}
    assert parse_spec(raw_without).digest != spec.digest
    for wrong, field in (
        ({"omop_names": "given"}, "identifiers.omop_names"),
        ({"names": "x"}, "identifiers.names"),
        ("person_source_value", "identifiers"),
    ):
        raw["identifiers"] = wrong
        with pytest.raises(SpecError) as error:
            parse_spec(raw)
        assert any(p.startswith(f"{field}:") for p in error.value.problems), error.value.problems
