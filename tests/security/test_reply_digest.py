"""A reply's digest is the SHA-256 of its canonical parts, however the arrays are fed to it.

:func:`fedstats.contract.paths.reply_digest` hashes each part in turn, an array's bytes
where they lie, instead of copying them all into one buffer. What a site signed before
must stay checkable, so the oracle is the one-buffer formula written out here (the
digest's documented definition), on replies of every field type, arrays of every dtype
and layout, small and of megabytes.
"""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from fedstats.contract import codec, paths


def one_buffer_digest(reply: dict) -> str:
    """SHA-256 of every field in sorted order: its name, a type tag and its value, each
    part length-prefixed (little-endian uint64), all joined in one buffer."""
    parts: list[bytes] = []
    for name in sorted(reply):
        value = reply[name]
        if isinstance(value, bool | np.bool_):
            tagged = [b"b" + bytes([bool(value)])]
        elif isinstance(value, int | np.integer):
            number = int(value)
            if -(2**63) <= number < 2**63:
                tagged = [b"i" + number.to_bytes(8, "little", signed=True)]
            else:
                tagged = [b"I" + str(number).encode()]
        elif isinstance(value, float | np.floating):
            tagged = [b"f" + np.float64(value).tobytes()]
        elif isinstance(value, str):
            tagged = [b"s" + value.encode()]
        elif isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            tagged = [b"a" + array.dtype.str.encode() + repr(array.shape).encode(), array.tobytes()]
        else:
            tagged = [b"c" + codec.encode(value)]
        for data in [name.encode(), *tagged]:
            parts += [len(data).to_bytes(8, "little"), data]
    return hashlib.sha256(b"".join(parts)).hexdigest()


values = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    arrays(
        st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_]),
        array_shapes(min_dims=0, max_dims=3, max_side=6),
    ),
    st.lists(st.integers(-5, 5), max_size=3),
)


@given(st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=6))
def test_the_digest_of_any_reply_is_the_one_buffer_formula(reply):
    assert paths.reply_digest(reply) == one_buffer_digest(reply)


def test_large_arrays_hashed_in_place_give_the_one_buffer_digest():
    """Arrays of megabytes, C- and Fortran-ordered and strided, beside small ones: a pooled
    Cox reply's ``S2`` on a daily grid is megabytes."""
    rng = np.random.default_rng(5)
    big = rng.normal(size=(3650, 10, 10))
    assert big.nbytes > 2**20
    reply = {
        "S2": big,
        "E2": np.asfortranarray(rng.normal(size=(500, 40))),
        "S1": rng.normal(size=(20_000, 4))[::2],
        "d": rng.integers(0, 9, 3650),
        "x_events": rng.normal(size=10),
        "loglik": -12.5,
        "truncated": 3,
    }
    assert paths.reply_digest(reply) == one_buffer_digest(reply)
    reply["S2"] = big.copy()
    reply["S2"][1234, 5, 6] += 1e-12  # one value changed: another digest
    assert paths.reply_digest(reply) != one_buffer_digest({**reply, "S2": big})
