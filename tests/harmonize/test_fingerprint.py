"""Site fingerprints describe the schema only and tell incompatible frames apart."""

from __future__ import annotations

import pandas as pd
import pytest

from harmonize import fingerprint_frame


def frame(**overrides) -> pd.DataFrame:
    base = {
        "age": [61.0, 72.0],
        "sex": pd.Categorical(["F", "M"], categories=["F", "M"]),
        "smoker": [True, False],
        "index_date": pd.to_datetime(["2020-01-01", "2021-05-03"]),
        "note": ["a", "b"],
    }
    base.update(overrides)
    return pd.DataFrame(base)


def test_kinds_levels_and_units():
    fp = fingerprint_frame(frame(), units={"age": "a"})
    by_name = {c.name: c for c in fp.columns}
    assert by_name["age"].kind == "numeric" and by_name["age"].unit == "a"
    assert by_name["sex"].kind == "categorical" and by_name["sex"].levels == ("F", "M")
    assert by_name["smoker"].kind == "boolean"
    assert by_name["index_date"].kind == "datetime"
    assert by_name["note"].kind == "text"


def test_same_schema_same_digest_whatever_the_rows():
    other_rows = frame(age=[30.0, 40.0], note=["x", "y"])
    assert fingerprint_frame(frame()).digest == fingerprint_frame(other_rows).digest


def test_declared_levels_not_observed_values_enter_the_fingerprint():
    only_f = frame(sex=pd.Categorical(["F", "F"], categories=["F", "M"]))
    assert fingerprint_frame(only_f).digest == fingerprint_frame(frame()).digest


def test_differences_are_named():
    a = fingerprint_frame(frame(), units={"age": "a"})
    b = fingerprint_frame(
        frame(sex=pd.Categorical(["F", "M"], categories=["F", "M", "X"])).drop(columns="note"),
        units={"age": "mo"},
    )
    assert a.digest != b.digest
    assert a.differences(b) == [
        "column 'age': unit 'a' vs 'mo'",
        "column 'note' only in the first frame",
        "column 'sex': levels ('F', 'M') vs ('F', 'M', 'X')",
    ]
    assert a.differences(a) == []


def test_units_for_unknown_columns_are_refused():
    with pytest.raises(ValueError, match="weight"):
        fingerprint_frame(frame(), units={"weight": "kg"})
