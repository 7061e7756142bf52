"""The [linkage] table: a valid one becomes a clkhash v3 schema; a malformed one a named error."""

from __future__ import annotations

import copy
import tomllib

import pytest
from clkhash import schema as clkhash_schema
from hypothesis import example, given
from hypothesis import strategies as st

import linkage
from linkage import LinkageSchemaError

SPEC = """
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
"""
TABLE = tomllib.loads(SPEC)["linkage"]


def test_the_example_table_becomes_a_valid_clkhash_v3_schema_with_hardened_defaults():
    schema = linkage.parse_linkage_table(TABLE)
    assert schema.columns == ("given_name", "family_name", "birth_date", "sex", "postal_code")
    assert (schema.hash, schema.xor_folds, schema.blocking.method) == ("blake", 1, "keys")
    document = schema.clkhash_dict()
    clkhash_schema.validate_schema_dict(document)  # clkhash/schemas/v3.json
    parsed = clkhash_schema.from_json_dict(document)
    assert parsed.l == 1024 and parsed.xor_folds == 1
    birth = parsed.fields[2]
    assert birth.format == "%Y-%m-%d"
    assert birth.hashing_properties.hash_type == "blakeHash"
    assert birth.hashing_properties.strategy.bits_per_token(8) == (13, 13, 13, 13, 12, 12, 12, 12)
    assert birth.hashing_properties.comparator.positional is True


def test_the_fingerprint_is_stable_and_changes_with_every_option():
    schema = linkage.parse_linkage_table(TABLE)
    assert schema.fingerprint() == linkage.parse_linkage_table(copy.deepcopy(TABLE)).fingerprint()
    assert len(schema.fingerprint()) == 64
    changes = [
        {"threshold": 0.75},
        {"length": 2048},
        {"xor_folds": 0},
        {"hash": "double"},
        {"salt": "another study"},
        {"blocking": "none"},
        {"blocking": {"method": "keys", "keys": [{"field": "birth_date", "first": 4}]}},
        {"fields": TABLE["fields"][:4]},
        {"fields": [*TABLE["fields"][:4], {"name": "postal_code", "ngram": 1, "bits": 61}]},
    ]
    prints = {linkage.parse_linkage_table({**TABLE, **c}).fingerprint() for c in changes}
    assert len(prints) == len(changes) and schema.fingerprint() not in prints


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"length": 1000}, "length", "power of two"),
        ({"length": "1024"}, "length", "integer"),
        ({"length": True}, "length", "integer"),
        ({"threshold": 1.5}, "threshold", "outside"),
        ({"threshold": float("nan")}, "threshold", "outside"),
        ({"hash": "md5"}, "hash", "blake"),
        ({"xor_folds": 9}, "xor_folds", "outside"),
        ({"salt": ""}, "salt", "non-empty"),
        ({"colour": "red"}, "colour", "unknown key"),
        ({"fields": []}, "fields", "non-empty"),
        ({"blocking": "lsh"}, "blocking.method", "'bits', 'keys' or 'none'"),
        ({"blocking": {"method": "bits", "tables": 0}}, "blocking.tables", "outside"),
        (
            {"blocking": {"method": "keys", "keys": [{"field": "ssn"}]}},
            "blocking.keys[0].field",
            "not an identifier column",
        ),
        ({"blocking": {"method": "none", "keys": []}}, "blocking.keys", "unknown key"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(change, field, says):
    with pytest.raises(LinkageSchemaError, match=says) as raised:
        linkage.parse_linkage_table({**TABLE, **change})
    assert raised.value.field == field
    assert str(raised.value).startswith(f"[linkage] {field}:")


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"name": "ssn", "ngram": 2, "bits": 100}, "fields[4].name"),
        ({"name": "given_name", "ngram": 2, "bits": 100}, "fields[4].name"),  # twice
        ({"name": "postal_code", "bits": 60}, "fields[4].ngram"),
        ({"name": "postal_code", "ngram": 0, "bits": 60}, "fields[4].ngram"),
        ({"name": "postal_code", "ngram": 1}, "fields[4].bits"),
        ({"name": "postal_code", "ngram": 1, "bits": 60, "bits_per_token": 6}, "fields[4].bits"),
        ({"name": "postal_code", "ngram": 1, "bits": 4096}, "fields[4].bits"),
        (
            {"name": "postal_code", "ngram": 1, "bits": 60, "positional": "yes"},
            "fields[4].positional",
        ),
        ({"name": "postal_code", "ngram": 1, "bits": 60, "weight": 2}, "fields[4].weight"),
        ("postal_code", "fields[4]"),
    ],
)
def test_a_bad_field_entry_is_refused_naming_its_index_and_key(entry, field):
    fields = [*TABLE["fields"][:4], entry]
    with pytest.raises(LinkageSchemaError) as raised:
        linkage.parse_linkage_table({**TABLE, "fields": fields})
    assert raised.value.field == field


def test_a_missing_required_key_is_named():
    for key in ("fields", "length", "threshold"):
        table = {k: v for k, v in TABLE.items() if k != key}
        with pytest.raises(LinkageSchemaError, match="missing") as raised:
            linkage.parse_linkage_table(table)
        assert raised.value.field == key


toml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["given_name", "birth_date", "keys", "bits", "none", "blake", "double"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "ngram",
                    "bits",
                    "bits_per_token",
                    "positional",
                    "method",
                    "keys",
                    "field",
                    "first",
                    "tables",
                    "seed",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.sampled_from([*sorted(TABLE), "hash", "xor_folds", "salt", "blocking", "extra"]),
        toml_values,
        max_size=6,
    ),
    st.booleans(),
)
@example({"blocking": {"method": []}}, True)  # an unhashable method once raised TypeError
def test_any_malformed_table_gives_a_schema_error_or_a_valid_schema(overrides, start_valid):
    """Whatever a spec file holds, parsing raises LinkageSchemaError or yields a schema that
    clkhash accepts — never another exception."""
    table = {**TABLE, **overrides} if start_valid else overrides
    try:
        schema = linkage.parse_linkage_table(table)
    except LinkageSchemaError as error:
        assert error.field and error.problem
    else:
        clkhash_schema.from_json_dict(schema.clkhash_dict())
        assert len(schema.fingerprint()) == 64


@given(st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers())))
def test_a_table_that_is_not_a_table_is_refused(value):
    with pytest.raises(LinkageSchemaError):
        linkage.parse_linkage_table(value)


def test_the_example_table_is_the_one_the_module_documents():
    """``linkage.schema.EXAMPLE_TABLE`` (which tests and the benchmark share) is the table of
    the module docstring (``SPEC`` here, less its blocking line), read by ``tomllib``."""
    assert linkage.schema.EXAMPLE_TABLE == TABLE
