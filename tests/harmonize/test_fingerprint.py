"""Site fingerprints describe the schema only and tell incompatible frames apart."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=50)
@given(
    ages=st.lists(
        st.one_of(st.floats(0, 120, allow_nan=False), st.none()), min_size=1, max_size=20
    ),
    row=st.integers(0, 19),
    delta=st.floats(1e-9, 10.0),
)
def test_the_data_fingerprint_names_the_rows_and_changes_with_any_value(ages, row, delta):
    """SHA-256 of the frame's CSV: equal for an equal frame (and to a hand-made CSV of it),
    different when one value changes, and equal at every site for the schema fingerprint."""
    import hashlib

    from harmonize.fingerprint import frame_data_digest

    data = pd.DataFrame({"age": ages, "sex": pd.Categorical(["f"] * len(ages), ["f", "m"])})
    digest = frame_data_digest(data)
    lines = ["age,sex"] + [("" if a is None else f"{a:.17g}") + ",f" for a in ages]
    assert digest == hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()
    assert frame_data_digest(data.copy()) == digest
    changed = data.copy()
    i = row % len(ages)
    changed.loc[i, "age"] = (0.0 if ages[i] is None else ages[i]) + delta
    assert frame_data_digest(changed) != digest
    assert fingerprint_frame(changed).digest == fingerprint_frame(data).digest  # same schema
