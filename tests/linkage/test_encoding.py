"""CLK encoding: known answers made under clkhash's declared cryptography, and bad input refused."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from bitarray import bitarray

import linkage
from linkage import IdentifierError, SecretError
from linkage.schema import EXAMPLE_TABLE

DATA = Path(__file__).with_name("data") / "known_answers.json"
KNOWN = json.loads(DATA.read_text())
SECRET = bytes(range(32))
TABLE = EXAMPLE_TABLE


def identifiers(**columns: list[str]) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {name: [""] * n for name in linkage.schema.IDENTIFIER_COLUMNS}
    base.update(columns)
    return pd.DataFrame(base, dtype=object)


def test_known_answers_were_made_under_the_cryptography_clkhash_declares():
    assert KNOWN["made_with"]["clkhash"] == "0.18.3"
    assert KNOWN["made_with"]["cryptography"].startswith("40.")
    import cryptography

    assert int(cryptography.__version__.split(".")[0]) >= 41  # the project's differs


@pytest.mark.parametrize("case", KNOWN["cases"], ids=lambda c: c["name"])
def test_encode_equals_clkhash_under_its_declared_cryptography(case):
    """The stored CLKs were made by tests/linkage/data/make_known_answers.py with clkhash 0.18.3
    and cryptography 40.0.2; encode() under the project's cryptography gives the same bytes."""
    schema = linkage.parse_linkage_table(case["linkage_table"])
    assert schema.clkhash_dict() == case["clkhash_schema"]
    table = pd.DataFrame(case["records"], dtype=object)
    encodings = linkage.encode(table, schema, bytes.fromhex(case["secret_hex"]))
    expected = np.array([list(base64.b64decode(c)) for c in case["clks_base64"]], dtype=np.uint8)
    assert encodings.clks.shape == (len(table), schema.length // 8)
    np.testing.assert_array_equal(encodings.clks, expected)
    assert encodings.fingerprint == schema.fingerprint()


def test_an_all_missing_record_sets_no_bit_and_a_full_one_sets_many():
    case = KNOWN["cases"][0]
    clks = [base64.b64decode(c) for c in case["clks_base64"]]
    assert case["records"][-1] == dict.fromkeys(case["columns"], "")
    assert not any(clks[-1])
    assert sum(bin(b).count("1") for b in clks[0]) > 200


def test_xor_folding_is_applied_to_the_encoding():
    """clkhash 0.18 reads ``xor_folds`` (its JSON schema documents ``xorFolds``): the folded
    encoding is the XOR of the two halves of the unfolded double-length one."""
    table = identifiers(given_name=["anna", "li"], family_name=["schmidt", "wu"])
    folded = linkage.parse_linkage_table({**TABLE, "length": 512, "xor_folds": 1})
    unfolded = linkage.parse_linkage_table({**TABLE, "length": 1024, "xor_folds": 0})
    a = linkage.encode(table, folded, SECRET).bitarrays()
    b = linkage.encode(table, unfolded, SECRET).bitarrays()
    for short, long in zip(a, b, strict=True):
        assert short == long[:512] ^ long[512:]


def test_bitarrays_round_trip_the_bytes():
    schema = linkage.parse_linkage_table(TABLE)
    encodings = linkage.encode(identifiers(given_name=["anna"]), schema, SECRET)
    bits = encodings.bitarrays()[0]
    assert isinstance(bits, bitarray) and len(bits) == 1024
    assert bits.tobytes() == encodings.clks[0].tobytes()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("given_name", "Anna"),
        ("given_name", "anna  marie"),
        ("family_name", "o'brien"),
        ("family_name", "müller"),
        ("birth_date", "1970-02-30"),
        ("birth_date", "1970-02"),
        ("birth_date", "19700201"),
        ("sex", "F"),
        ("postal_code", "sw1a 1aa"),
    ],
)
def test_a_value_not_in_normal_form_is_refused_naming_column_and_row(column, value):
    schema = linkage.parse_linkage_table(TABLE)
    table = identifiers(given_name=["anna", "li", "jo"]).set_axis(["p1", "p2", "p3"])
    table.loc["p2", column] = value
    with pytest.raises(IdentifierError, match="normal form") as raised:
        linkage.encode(table, schema, SECRET)
    assert raised.value.column == column and raised.value.row == "p2"


def test_a_missing_value_that_is_not_the_empty_string_is_refused():
    schema = linkage.parse_linkage_table(TABLE)
    table = identifiers(given_name=["anna", None])
    with pytest.raises(IdentifierError, match="not a string") as raised:
        linkage.encode(table, schema, SECRET)
    assert raised.value.row == 1


def test_a_missing_column_is_refused():
    schema = linkage.parse_linkage_table(TABLE)
    table = identifiers(given_name=["anna"]).drop(columns="postal_code")
    with pytest.raises(IdentifierError, match="'postal_code': missing"):
        linkage.encode(table, schema, SECRET)


@pytest.mark.parametrize("secret", [b"", b"short", "a string secret of 32 characters", None])
def test_a_weak_or_wrong_secret_is_refused(secret):
    schema = linkage.parse_linkage_table(TABLE)
    with pytest.raises(SecretError, match="at least 16"):
        linkage.encode(identifiers(given_name=["anna"]), schema, secret)


def test_blocking_tokens_follow_the_key_and_the_secret():
    schema = linkage.parse_linkage_table(TABLE)  # default blocking: keys
    table = identifiers(
        family_name=["schmidt", "schmid", "wu", ""],
        birth_date=["1970-03-01", "1970-12-31", "1970-03-01", ""],
        postal_code=["8001", "8002", "9001", ""],
    )
    tokens = linkage.encode(table, schema, SECRET).blocking_tokens
    keys = [k.field for k in schema.blocking.keys]
    assert keys == ["birth_date", "postal_code", "family_name"]
    year, postal, family = tokens[:, 0], tokens[:, 1], tokens[:, 2]
    assert year[0] == year[1] == year[2] != 0
    assert postal[0] == postal[1] != postal[2]
    assert family[0] == family[1] != family[2]
    assert not tokens[3].any()  # missing values get no token
    other = linkage.encode(table, schema, bytes(reversed(SECRET))).blocking_tokens
    assert not np.isin(other[:3], tokens[:3]).any()
