"""The codec: round trips of plain values, refusal of everything else, robust decoding."""

from __future__ import annotations

import contextlib
import json
import struct

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedstats.contract import codec
from fedstats.errors import CodecError

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
arrays = hnp.arrays(
    dtype=st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
)
keys = st.text(max_size=8).filter(lambda k: not k.startswith("$"))
messages = st.recursive(
    scalars | arrays,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)


def assert_same(a, b):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


@given(messages)
@settings(max_examples=200, deadline=None)
def test_round_trip_of_plain_values_and_arrays(message):
    assert_same(message, codec.decode(codec.encode(message)))


def test_non_finite_floats_survive():
    out = codec.decode(codec.encode({"a": float("nan"), "b": float("inf")}))
    assert np.isnan(out["a"]) and out["b"] == float("inf")


@pytest.mark.parametrize(
    "value",
    [
        pd.DataFrame({"age": [61, 72]}),
        pd.Series([1, 2]),
        lambda x: x,
        print,
        object(),
        {1: "non-string key"},
        {"$a": 0},
        np.array(["text"]),
        np.array([1 + 2j]),
        np.array([object()], dtype=object),
        b"raw bytes",
        {1.5, 2.5},
    ],
    ids=[
        "DataFrame",
        "Series",
        "lambda",
        "builtin",
        "object",
        "int-key",
        "reserved-key",
        "str-array",
        "complex-array",
        "object-array",
        "bytes",
        "set",
    ],
)
def test_refuses_anything_but_plain_values(value):
    with pytest.raises(CodecError):
        codec.encode({"reply": value})


def test_error_names_where_the_bad_value_was():
    with pytest.raises(CodecError, match=r"message\.result\.rows.*DataFrame"):
        codec.encode({"result": {"rows": pd.DataFrame({"x": [1]})}})


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_decoding_arbitrary_bytes_raises_only_codec_error(data):
    with contextlib.suppress(CodecError):
        codec.decode(data)


@given(messages, st.data())
@settings(max_examples=200, deadline=None)
def test_corrupted_messages_raise_only_codec_error(message, data):
    raw = bytearray(codec.encode(message))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    for candidate in (bytes(raw), bytes(raw[:cut]), bytes(raw) + b"\x00"):
        with contextlib.suppress(CodecError):
            codec.decode(candidate)


def test_trailing_bytes_are_refused():
    with pytest.raises(CodecError, match="trailing"):
        codec.decode(codec.encode({"a": np.arange(3)}) + b"x")


def test_big_endian_arrays_arrive_little_endian():
    out = codec.decode(codec.encode(np.arange(4, dtype=">f8")))
    np.testing.assert_array_equal(out, np.arange(4.0))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=16,
)
"""Whatever JSON a coordinator can write in a message header."""


def framed(header: dict, body: bytes = b"") -> bytes:
    """A message with ``header`` as its JSON header, as :func:`codec.encode` frames one."""
    text = json.dumps(header).encode("utf-8")
    return codec.MAGIC + struct.pack("<I", len(text)) + text + body


@given(
    table=json_values | st.lists(st.lists(json_values, min_size=4, max_size=4), max_size=3),
    body=st.binary(max_size=32),
)
@settings(max_examples=400, deadline=None)
def test_any_array_table_a_header_holds_raises_only_codec_error(table, body):
    """The array table is read before any value: a dtype, shape, offset or size of any JSON
    type (a list where a dtype string goes, a number where the table goes) is refused as
    malformed, never a TypeError from the reader."""
    with contextlib.suppress(CodecError):
        codec.decode(framed({"v": {"x": {"$a": 0}}, "b": table}, body))


@pytest.mark.parametrize(
    "table",
    [[[[], [1], 0, 8]], [[{"<f8": 1}, [1], 0, 8]], [[8, [1], 0, 8]], 5, 2.5, True],
    ids=["list dtype", "object dtype", "number dtype", "number table", "float table", "flag"],
)
def test_an_array_table_of_the_wrong_types_is_a_codec_error(table):
    with pytest.raises(CodecError, match="array"):
        codec.decode(framed({"v": {"x": {"$a": 0}}, "b": table}, b"\x00" * 8))
