"""Reply schemas: the exact shape every task's reply must have.

A task declares, from the request alone, which fields its reply holds and
how large each may be. Because the declaration sees only the request (the
number of parameters, the number of levels asked for, ...) and never the
site's frame, a reply whose size grows with the number of patients cannot
match it. The same check runs at the silo before a reply leaves and at the
coordinator when it arrives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Number:
    """One finite-or-not scalar (int, float or bool)."""

    def size(self) -> int:
        return 1

    def mismatch(self, value: Any) -> str | None:
        if isinstance(value, bool | int | float) and not isinstance(value, np.ndarray):
            return None
        return f"expected a number, got {type(value).__name__}"


@dataclass(frozen=True)
class Array:
    """A numeric array of exactly this shape."""

    shape: tuple[int, ...]

    def size(self) -> int:
        return math.prod(self.shape)

    def mismatch(self, value: Any) -> str | None:
        if not isinstance(value, np.ndarray):
            return f"expected an array of shape {self.shape}, got {type(value).__name__}"
        if value.shape != self.shape:
            return f"expected shape {self.shape}, got {value.shape}"
        return None


@dataclass(frozen=True)
class Text:
    """One string of at most ``max_chars`` characters."""

    max_chars: int = 200

    def size(self) -> int:
        return 1

    def mismatch(self, value: Any) -> str | None:
        if not isinstance(value, str):
            return f"expected a string, got {type(value).__name__}"
        if len(value) > self.max_chars:
            return f"string of {len(value)} characters exceeds {self.max_chars}"
        return None


@dataclass(frozen=True)
class Values:
    """A list of at most ``max_items`` numbers or short strings (e.g. category levels)."""

    max_items: int
    max_chars: int = 200

    def size(self) -> int:
        return self.max_items

    def mismatch(self, value: Any) -> str | None:
        if not isinstance(value, list):
            return f"expected a list, got {type(value).__name__}"
        if len(value) > self.max_items:
            return f"{len(value)} items exceed the limit of {self.max_items}"
        for item in value:
            if isinstance(item, str):
                if len(item) > self.max_chars:
                    return f"item of {len(item)} characters exceeds {self.max_chars}"
            elif not isinstance(item, bool | int | float):
                return f"item of type {type(item).__name__} is not a number or string"
        return None


@dataclass(frozen=True)
class Ciphertexts:
    """Paillier ciphertexts, one per linked pair: a ``(count, words)`` uint64 array
    (:mod:`fedstats.contract.tasks.vertical`), under the public key in the reply's field
    ``key``.

    The one field whose size is the number of patients (``count`` is the request's number
    of linked pairs), so the one exception to the parameter-size rule. A site releases it
    only as ciphertexts under a key it made fresh for that reply, each one re-randomised
    (:mod:`fedstats.site.ciphertext_replies`); nothing else may travel in it.
    """

    count: int
    words: int
    key: str

    def size(self) -> int:
        return self.count * self.words

    def mismatch(self, value: Any) -> str | None:
        if not (isinstance(value, np.ndarray) and value.dtype == np.uint64):
            return f"expected ciphertexts as 64-bit words, got {type(value).__name__}"
        if value.shape != (self.count, self.words):
            return f"expected shape {(self.count, self.words)}, got {value.shape}"
        return None


@dataclass(frozen=True)
class RecordCodes:
    """Record-linkage codes, one row per record of a site's identifier table: a
    ``(count, width)`` array of ``dtype`` (``"uint8"``: the bytes of each record's Bloom
    filter encoding; ``"uint64"``: its keyed blocking tokens), in an order of the site's own
    drawing (:mod:`fedstats.contract.tasks.record_linkage`).

    The second field whose size is the number of patients (``count`` is the request's
    number of records), so the second exception to the parameter-size rule; a site releases
    it only in the task that encodes its identifiers, at its own schema's width
    (:mod:`fedstats.site.encoding_replies`).
    """

    count: int
    width: int
    dtype: str

    def size(self) -> int:
        return self.count * self.width

    def mismatch(self, value: Any) -> str | None:
        if not (isinstance(value, np.ndarray) and value.dtype == np.dtype(self.dtype)):
            return f"expected record codes of dtype {self.dtype}, got {_described(value)}"
        if value.shape != (self.count, self.width):
            return f"expected shape {(self.count, self.width)}, got {value.shape}"
        return None


def _described(value: Any) -> str:
    return f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__


Field = Number | Array | Text | Values | Ciphertexts | RecordCodes
ReplySchema = Mapping[str, Field]


def schema_mismatch(payload: Any, schema: ReplySchema) -> str | None:
    """Return why ``payload`` does not match ``schema``, or ``None`` when it does."""
    if not isinstance(payload, dict):
        return f"reply must be a mapping of fields, got {type(payload).__name__}"
    missing = sorted(set(schema) - set(payload))
    extra = sorted(set(payload) - set(schema))
    if missing or extra:
        return (
            f"reply fields do not match the task's declaration (missing {missing}, extra {extra})"
        )
    for name, field in schema.items():
        problem = field.mismatch(payload[name])
        if problem:
            return f"field {name!r}: {problem}"
    return None
