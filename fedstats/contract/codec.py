"""The one codec for every message between a silo and the coordinator.

A message is a tree of plain values: ``None``, ``bool``, ``int``, ``float``,
``str``, lists (or tuples) of them, dicts with string keys, and numeric numpy
arrays. Anything else (a DataFrame, a callable, an arbitrary object) is
refused with :class:`~fedstats.errors.CodecError` naming where in the message
it was found. The codec is used even when all silos run in one process, so
the embedded runtime exercises exactly the bytes a network transport carries.

Wire format (version 1)::

    b"FSC1" | uint32 little-endian header length | header (UTF-8 JSON) | array buffers

The header holds the value tree with every array replaced by ``{"$a": i}``
and a table ``[dtype, shape, offset, nbytes]`` locating array ``i`` among the
buffers. Decoding checks every bound, refuses unknown dtypes and trailing
bytes, and never unpickles.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedstats.errors import CodecError

MAGIC = b"FSC1"
MAX_MESSAGE_BYTES = 1 << 30
MAX_DEPTH = 32
MAX_INT_DIGITS = 20
"""The most digits a JSON integer in a header may have (2**64 has 20)."""
_ARRAY_KEY = "$a"
_ALLOWED_DTYPES = frozenset(
    ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f4", "<f8"]
)
_HEADER = struct.Struct("<I")


def encode(message: Any) -> bytes:
    """Encode a message of plain values and numeric arrays to bytes."""
    buffers: list[bytes | np.ndarray] = []
    table: list[list[Any]] = []
    tree = _to_tree(message, buffers, table, path="message", depth=0)
    header = json.dumps({"v": tree, "b": table}, allow_nan=True, separators=(",", ":"))
    header_bytes = header.encode("utf-8")
    out = b"".join([MAGIC, _HEADER.pack(len(header_bytes)), header_bytes, *buffers])
    if len(out) > MAX_MESSAGE_BYTES:
        raise CodecError(f"message of {len(out)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    return out


def decode(data: bytes) -> Any:
    """Decode bytes made by :func:`encode`; anything else raises :class:`CodecError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodecError(f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    header_len = header_length(data)
    if header_len is None:
        raise CodecError("not a fedstats message (bad magic)")
    start = len(MAGIC) + _HEADER.size
    if start + header_len > len(data):
        raise CodecError("truncated message header")
    try:
        header = json.loads(data[start : start + header_len].decode("utf-8"), parse_int=_integer)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CodecError(f"message header is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"v", "b"}:
        raise CodecError("message header must hold exactly the keys 'v' and 'b'")
    body = memoryview(data)[start + header_len :]
    arrays = _read_arrays(header["b"], body)
    try:
        return _built(header["v"], arrays, 0)
    except _Malformed:  # read again, naming where the message is malformed
        return _from_tree(header["v"], arrays, path="message", depth=0)


def header_length(data: bytes | bytearray | memoryview) -> int | None:
    """The header length a message declares, read without decoding anything (``None`` when
    the bytes are not a message): a site bounds it before it parses the header."""
    if len(data) < len(MAGIC) + _HEADER.size or bytes(data[: len(MAGIC)]) != MAGIC:
        return None
    (length,) = _HEADER.unpack_from(data, len(MAGIC))
    return int(length)


def _integer(text: str) -> int:
    """A JSON integer of at most :data:`MAX_INT_DIGITS` digits, else :class:`CodecError`.

    Python refuses to convert longer digit strings (``int()`` raises ``ValueError`` past
    4,300 digits, a guard against quadratic-time parsing, CVE-2020-10735); no field of a
    message needs an integer beyond 64 bits, so anything longer is a malformed message.
    """
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise CodecError(
            f"message header holds an integer of {len(text.lstrip('-'))} digits; "
            f"integers have at most {MAX_INT_DIGITS}"
        )
    return int(text)


def _to_tree(
    value: Any, buffers: list[bytes | np.ndarray], table: list[list[Any]], path: str, depth: int
) -> Any:
    if depth > MAX_DEPTH:
        raise CodecError(f"{path}: nesting deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return _array_ref(value, buffers, table, path)
    if isinstance(value, list | tuple):
        return [
            _to_tree(item, buffers, table, f"{path}[{i}]", depth + 1)
            for i, item in enumerate(value)
        ]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CodecError(f"{path}: dict key {key!r} is not a string")
            if key.startswith("$"):
                raise CodecError(f"{path}: dict key {key!r} may not start with '$'")
            out[key] = _to_tree(item, buffers, table, f"{path}.{key}", depth + 1)
        return out
    raise CodecError(
        f"{path}: a {type(value).__module__}.{type(value).__qualname__} cannot cross the silo "
        "boundary; only numbers, strings, lists, dicts and numeric arrays can"
    )


def _array_ref(
    array: np.ndarray, buffers: list[bytes | np.ndarray], table: list[list[Any]], path: str
) -> dict:
    if array.dtype.kind not in "biuf":
        raise CodecError(f"{path}: array of dtype {array.dtype} cannot cross the silo boundary")
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    dtype = little.dtype.str
    if dtype not in _ALLOWED_DTYPES:
        raise CodecError(f"{path}: array dtype {dtype} is not supported")
    raw = np.ascontiguousarray(little).reshape(-1).view(np.uint8)  # its bytes, C order: a view
    # of a contiguous array (copied once, by encode's join), a copy of any other
    offset = table[-1][2] + table[-1][3] if table else 0  # where the last buffer ended
    buffers.append(raw)
    table.append([dtype, list(little.shape), offset, len(raw)])
    return {_ARRAY_KEY: len(table) - 1}


def _read_arrays(table: Any, body: memoryview) -> list[np.ndarray]:
    if not isinstance(table, list):
        raise CodecError("array table must be a list")
    arrays = []
    expected_offset = 0
    for i, entry in enumerate(table):
        if not (isinstance(entry, list) and len(entry) == 4):
            raise CodecError(f"array {i}: malformed table entry")
        dtype, shape, offset, nbytes = entry
        if not isinstance(dtype, str) or dtype not in _ALLOWED_DTYPES:  # a list is unhashable
            raise CodecError(f"array {i}: dtype {dtype!r} is not supported")
        if not (isinstance(shape, list) and len(shape) <= MAX_DEPTH) or not all(
            type(s) is int and s >= 0 for s in shape
        ):
            raise CodecError(f"array {i}: malformed shape {shape!r}")
        if type(offset) is not int or type(nbytes) is not int or offset != expected_offset:
            raise CodecError(f"array {i}: buffers must be contiguous and in order")
        itemsize = np.dtype(dtype).itemsize
        if math.prod(shape) * itemsize != nbytes or offset + nbytes > len(body):
            raise CodecError(f"array {i}: buffer size does not match shape {shape} and {dtype}")
        try:  # an empty array may declare dimensions numpy cannot hold
            arr = np.frombuffer(body[offset : offset + nbytes], dtype=dtype).reshape(shape).copy()
        except (ValueError, OverflowError) as exc:
            raise CodecError(f"array {i}: shape {shape} cannot be made: {exc}") from None
        arrays.append(arr)
        expected_offset = offset + nbytes
    if expected_offset != len(body):
        raise CodecError(f"{len(body) - expected_offset} trailing byte(s) after the last array")
    return arrays


class _Malformed(Exception):
    """Raised by :func:`_built` at anything :func:`_from_tree` would refuse."""


_SCALARS = (str, float, int, bool, type(None))


def _built(node: Any, arrays: list[np.ndarray], depth: int) -> Any:
    """:func:`_from_tree` without building the path of every node (JSON gives exact types):
    the common case, a well-formed message; anything else raises :class:`_Malformed`, and the
    message is read again by :func:`_from_tree` for its error."""
    if depth > MAX_DEPTH:
        raise _Malformed
    kind = type(node)
    if kind in _SCALARS:
        return node
    if kind is list:
        return [_built(item, arrays, depth + 1) for item in node]
    if kind is not dict:
        raise _Malformed
    if _ARRAY_KEY in node:
        index = node[_ARRAY_KEY]
        if len(node) != 1 or type(index) is not int or not 0 <= index < len(arrays):
            raise _Malformed
        return arrays[index]
    out = {}
    for key, value in node.items():
        if key.startswith("$"):
            raise _Malformed
        out[key] = _built(value, arrays, depth + 1)
    return out


def _from_tree(node: Any, arrays: list[np.ndarray], path: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise CodecError(f"{path}: nesting deeper than {MAX_DEPTH} levels")
    if node is None or isinstance(node, bool | int | float | str):
        return node
    if isinstance(node, list):
        return [_from_tree(item, arrays, f"{path}[{i}]", depth + 1) for i, item in enumerate(node)]
    if isinstance(node, Mapping):
        if _ARRAY_KEY in node:
            index = node[_ARRAY_KEY]
            if len(node) != 1 or type(index) is not int or not 0 <= index < len(arrays):
                raise CodecError(f"{path}: malformed array reference")
            return arrays[index]
        for key in node:
            if key.startswith("$"):
                raise CodecError(f"{path}: reserved key {key!r}")
        return {k: _from_tree(v, arrays, f"{path}.{k}", depth + 1) for k, v in node.items()}
    raise CodecError(f"{path}: unsupported value of type {type(node).__name__}")
