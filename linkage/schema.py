"""The study spec's ``[linkage]`` table, validated into a frozen schema, and its clkhash form.

A table such as::

    [linkage]
    fields = [
      { name = "given_name",  ngram = 2, bits = 200 },
      { name = "family_name", ngram = 2, bits = 200 },
      { name = "birth_date",  ngram = 1, bits = 100, positional = true },
      { name = "sex",         ngram = 1, bits = 30,  positional = true },
      { name = "postal_code", ngram = 1, bits = 60,  positional = true },
    ]
    length = 1024          # bits of the encoding each record becomes
    threshold = 0.8        # Dice similarity at which two encodings link
    blocking = "keys"      # or "bits", "none", or a table (see Blocking)

becomes a :class:`LinkageSchema`; :meth:`LinkageSchema.clkhash_dict` writes it as
clkhash's linkage schema v3 (``clkhash/schemas/v3.json``) and
:meth:`LinkageSchema.fingerprint` is the SHA-256 of its canonical JSON, which both
parties and the linkage unit compare before anything is matched.

Hardening (clkhash's options, hardened by default)
--------------------------------------------------
Every field goes into one record-level Bloom filter (a cryptographic long-term key,
CLK; Schnell, Bachteler and Reiher 2011, BMC Med Inform Decis Mak 11:46).

- ``hash = "blake"`` (default): each n-gram's k bit positions are slices of one keyed
  BLAKE2b MAC (clkhash ``blakeHash``). ``"double"`` is Schnell's double hashing
  (``g_i = h1 + i h2 mod l``, with clkhash's ``prevent_singularity``), which admits only
  l^2 bit patterns per n-gram and was broken by Kroll and Steinmetzer 2015 ("Automated
  cryptanalysis of Bloom filter encryptions of health records", HEALTHINF); it is kept
  only to reproduce older encodings.
- ``bits`` (default strategy, clkhash ``bitsPerFeature``): a field sets the same number
  of insertions whatever its value's length, so a filter's Hamming weight says less
  about name lengths. ``bits_per_token`` (``bitsPerToken``, k per n-gram) instead makes
  the weight grow with the value's length.
- ``xor_folds`` (clkhash ``xor_folds``): the filter is made 2^folds times longer and
  folded onto itself by XOR (Schnell, Borgs and Encarnação 2016, "A new method for
  PPRL using XOR-folding of Bloom filter encodings"), which breaks the one-to-one link
  between an n-gram and fixed bit positions. Default 1 (see the benchmark for its cost
  in linkage quality).
- ``salt``: the HKDF salt; a study-specific salt makes encodings of the same person
  under the same secret unlinkable across studies with different salts.

What they do not protect against: the encodings of one study are deterministic, so a
linkage unit holding many of them can still count how often a bit pattern occurs and
align frequent patterns with frequent names or n-grams. Christen, Schnell, Vatsalan and
Ranbaduge 2017 ("Efficient cryptanalysis of Bloom filters for privacy-preserving record
linkage", PAKDD) and Christen, Ranbaduge, Vatsalan and Schnell 2018 ("Precise and fast
cryptanalysis for Bloom filter based privacy-preserving record linkage", IEEE TKDE 31)
re-identify frequent values by pattern mining on field-level and record-level filters;
BLAKE hashing defeats the double-hashing attack, not these; folding and per-feature
insertions make them less precise, no option here makes them impossible. The secret
must never reach the linkage unit: with it, every encoding is a dictionary attack away.
``tests/linkage/test_attacks.py`` measures what hardening changes and what it does not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from linkage.errors import LinkageSchemaError

EXAMPLE_TABLE: dict[str, Any] = {
    "fields": [
        {"name": "given_name", "ngram": 2, "bits": 200},
        {"name": "family_name", "ngram": 2, "bits": 200},
        {"name": "birth_date", "ngram": 1, "bits": 100, "positional": True},
        {"name": "sex", "ngram": 1, "bits": 30, "positional": True},
        {"name": "postal_code", "ngram": 1, "bits": 60, "positional": True},
    ],
    "length": 1024,
    "threshold": 0.8,
}
"""The example ``[linkage]`` table of the module docstring, as ``tomllib`` reads it (the
hardened defaults for the rest). On FEBRL4's whole-name replacements it reaches recall 0.71
only; ``benchmarks/linkage.py`` measures it beside a table weighting birth date and postal
code more. Copy it before changing it."""

IDENTIFIER_COLUMNS = ("given_name", "family_name", "birth_date", "sex", "postal_code")
"""The identifier table's columns, in its order (the interface with ``harmonize``)."""

_COLUMNS = ", ".join(IDENTIFIER_COLUMNS)

SEX_CODES = ("male", "female", "other", "unknown")
"""FHIR AdministrativeGender codes, the normal form of the ``sex`` column."""

_FORMATS: dict[str, dict[str, Any]] = {
    "given_name": {"type": "string", "encoding": "utf-8"},
    "family_name": {"type": "string", "encoding": "utf-8"},
    "birth_date": {"type": "date", "format": "%Y-%m-%d"},
    "sex": {"type": "enum", "values": list(SEX_CODES)},
    "postal_code": {"type": "string", "encoding": "utf-8"},
}
"""clkhash's format of each identifier column (dates are hashed as ``YYYYMMDD``)."""

_TABLE_KEYS = {"fields", "length", "threshold", "hash", "xor_folds", "salt", "blocking"}
_FIELD_KEYS = {"name", "ngram", "bits", "bits_per_token", "positional"}
_BLOCKING_KEYS = {
    "none": {"method"},
    "bits": {"method", "tables", "bits", "seed"},
    "keys": {"method", "keys"},
}
_KEY_KEYS = {"field", "first"}
_KDF_KEY_SIZE = 64


@dataclass(frozen=True)
class FieldEncoding:
    """How one identifier column enters the Bloom filter.

    ``bits`` is the number of insertions of the whole field (clkhash ``bitsPerFeature``);
    when ``per_token`` is true, it is the insertions of each n-gram (``bitsPerToken``).
    """

    name: str
    ngram: int
    bits: int
    positional: bool = False
    per_token: bool = False


@dataclass(frozen=True)
class BlockingKey:
    """A separately encoded blocking key: the first ``first`` characters of a column (all if 0)."""

    field: str
    first: int = 0


@dataclass(frozen=True)
class Blocking:
    """Which records the linkage unit compares.

    - ``"none"``: every record with every record (n x m Dice coefficients).
    - ``"bits"``: anonlink's bit blocking on the encodings themselves (Hamming LSH):
      ``tables`` tables, each keyed on ``bits`` bit positions drawn with ``seed``; two
      records are compared when they agree on all positions of at least one table. It
      needs nothing the linkage unit does not already see, and may miss a true pair.
    - ``"keys"``: each site also sends, per record and key, a keyed hash (HMAC-SHA256
      under a key derived from the shared secret) of a key's value; records sharing a
      hash of any key are compared. The linkage unit sees which records share a key
      value, i.e. the size of every key value's group (a frequency table): coarse keys.
    """

    method: Literal["none", "bits", "keys"] = "keys"
    tables: int = 24
    bits: int = 14
    seed: int = 0
    keys: tuple[BlockingKey, ...] = (
        BlockingKey("birth_date", 4),
        BlockingKey("postal_code", 3),
        BlockingKey("family_name", 2),
    )


DEFAULT_BLOCKING_KEYS = Blocking().keys
"""``blocking = "keys"``: birth year, first 3 characters of the postal code, or first two
letters of the family name: a true pair is compared unless all three differ."""


@dataclass(frozen=True)
class LinkageSchema:
    """The validated ``[linkage]`` table; build it with :func:`parse_linkage_table`."""

    fields: tuple[FieldEncoding, ...]
    length: int
    threshold: float
    hash: Literal["blake", "double"] = "blake"
    xor_folds: int = 1
    salt: str | None = None
    blocking: Blocking = Blocking()

    @property
    def columns(self) -> tuple[str, ...]:
        """The identifier columns the encoding reads, in the schema's order."""
        return tuple(f.name for f in self.fields)

    @property
    def length_bytes(self) -> int:
        """Bytes of one encoding."""
        return self.length // 8

    def clkhash_dict(self) -> dict[str, Any]:
        """The clkhash linkage schema (version 3) this table describes.

        Returns
        -------
        dict
            Valid against ``clkhash/schemas/v3.json``; ``clkhash.schema.from_json_dict``
            reads it. The fold count is written twice: ``xorFolds`` as the JSON schema
            documents it, ``xor_folds`` as clkhash 0.18's reader looks it up.
        """
        kdf: dict[str, Any] = {"type": "HKDF", "hash": "SHA256", "keySize": _KDF_KEY_SIZE}
        if self.salt is not None:
            kdf["salt"] = base64.b64encode(self.salt.encode("utf-8")).decode("ascii")
        hashing_function = (
            {"type": "blakeHash"}
            if self.hash == "blake"
            else {"type": "doubleHash", "prevent_singularity": True}
        )
        features = []
        for field in self.fields:
            strategy = {"bitsPerToken" if field.per_token else "bitsPerFeature": field.bits}
            features.append(
                {
                    "identifier": field.name,
                    "format": dict(_FORMATS[field.name]),
                    "hashing": {
                        "comparison": {
                            "type": "ngram",
                            "n": field.ngram,
                            "positional": field.positional,
                        },
                        "strategy": strategy,
                        "hash": dict(hashing_function),
                        "missingValue": {"sentinel": "", "replaceWith": ""},
                    },
                }
            )
        return {
            "version": 3,
            "clkConfig": {
                "l": self.length,
                "xorFolds": self.xor_folds,
                "xor_folds": self.xor_folds,
                "kdf": kdf,
            },
            "features": features,
        }

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the canonical JSON of the clkhash schema and the blocking.

        Canonical: keys sorted, no whitespace, ASCII. Two parties' encodings are
        comparable only under equal fingerprints.
        """
        blocking = {
            "method": self.blocking.method,
            "tables": self.blocking.tables,
            "bits": self.blocking.bits,
            "seed": self.blocking.seed,
            "keys": [[k.field, k.first] for k in self.blocking.keys],
        }
        document = {"clkhash": self.clkhash_dict(), "threshold": self.threshold}
        document["blocking"] = blocking
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode("ascii")).hexdigest()


def parse_linkage_table(table: Mapping[str, Any]) -> LinkageSchema:
    """Validate a ``[linkage]`` table (as ``tomllib`` returns it) into a :class:`LinkageSchema`.

    Parameters
    ----------
    table
        The table's contents: ``fields``, ``length``, ``threshold`` and optionally
        ``hash``, ``xor_folds``, ``salt``, ``blocking`` (see the module docstring).

    Returns
    -------
    LinkageSchema

    Raises
    ------
    LinkageSchemaError
        Naming the first offending key path (e.g. ``fields[2].ngram``) and what to do.
    """
    if not isinstance(table, Mapping):
        raise LinkageSchemaError("(table)", "expected a table of keys, e.g. fields = [...]")
    _no_unknown_keys(table, _TABLE_KEYS, "")
    for required in ("fields", "length", "threshold"):
        if required not in table:
            raise LinkageSchemaError(required, "missing; add it to the [linkage] table")
    length = _integer(table["length"], "length", 64, 8192)
    if length & (length - 1):
        raise LinkageSchemaError(
            "length", f"{length} is not a power of two; clkhash's BLAKE2 hashing needs one"
        )
    threshold = table["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise LinkageSchemaError("threshold", "expected a number in (0, 1], e.g. 0.8")
    if not (math.isfinite(threshold) and 0 < threshold <= 1):
        raise LinkageSchemaError("threshold", f"{threshold} is outside (0, 1]; e.g. 0.8")
    hash_ = table.get("hash", "blake")
    if hash_ not in ("blake", "double"):
        raise LinkageSchemaError("hash", f"{hash_!r} is not 'blake' (recommended) or 'double'")
    xor_folds = _integer(table.get("xor_folds", 1), "xor_folds", 0, 3)
    salt = table.get("salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise LinkageSchemaError("salt", "expected a non-empty string, e.g. the study's name")
    fields = _fields(table["fields"], length)
    blocking = _blocking(table.get("blocking", "keys"), length)
    return LinkageSchema(
        fields=fields,
        length=length,
        threshold=float(threshold),
        hash=hash_,
        xor_folds=xor_folds,
        salt=salt,
        blocking=blocking,
    )


def _fields(raw: Any, length: int) -> tuple[FieldEncoding, ...]:
    if not isinstance(raw, list) or not raw:
        raise LinkageSchemaError("fields", "expected a non-empty list of { name, ngram, bits }")
    fields = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"fields[{i}]"
        if not isinstance(entry, Mapping):
            raise LinkageSchemaError(
                where, "expected a table { name = ..., ngram = ..., bits = ... }"
            )
        _no_unknown_keys(entry, _FIELD_KEYS, where + ".")
        name = entry.get("name")
        if name not in IDENTIFIER_COLUMNS:
            raise LinkageSchemaError(
                where + ".name",
                f"{name!r} is not an identifier column; use one of {IDENTIFIER_COLUMNS}",
            )
        if name in seen:
            raise LinkageSchemaError(where + ".name", f"{name!r} is listed twice; keep one")
        seen.add(name)
        if "ngram" not in entry:
            raise LinkageSchemaError(where + ".ngram", "missing; e.g. ngram = 2 for names")
        ngram = _integer(entry["ngram"], where + ".ngram", 1, 4)
        if ("bits" in entry) == ("bits_per_token" in entry):
            raise LinkageSchemaError(
                where + ".bits", "give exactly one of bits (recommended) or bits_per_token"
            )
        per_token = "bits_per_token" in entry
        key = "bits_per_token" if per_token else "bits"
        bits = _integer(entry[key], f"{where}.{key}", 1, length)
        positional = entry.get("positional", False)
        if not isinstance(positional, bool):
            raise LinkageSchemaError(where + ".positional", "expected true or false")
        fields.append(FieldEncoding(name, ngram, bits, positional, per_token))
    return tuple(fields)


def _blocking(raw: Any, length: int) -> Blocking:
    if isinstance(raw, str):
        raw = {"method": raw}
    if not isinstance(raw, Mapping):
        raise LinkageSchemaError("blocking", "expected 'bits', 'keys', 'none' or a table")
    method = raw.get("method")
    if not isinstance(method, str) or method not in _BLOCKING_KEYS:
        raise LinkageSchemaError("blocking.method", f"{method!r} is not 'bits', 'keys' or 'none'")
    _no_unknown_keys(raw, _BLOCKING_KEYS[method], "blocking.")
    if method == "none":
        return Blocking("none", keys=())
    if method == "bits":
        default = Blocking("bits")
        tables = _integer(raw.get("tables", default.tables), "blocking.tables", 1, 256)
        bits = _integer(raw.get("bits", default.bits), "blocking.bits", 1, min(62, length))
        seed = _integer(raw.get("seed", default.seed), "blocking.seed", 0, 2**32 - 1)
        return Blocking("bits", tables=tables, bits=bits, seed=seed, keys=())
    keys_raw = raw.get("keys")
    if keys_raw is None:
        return Blocking("keys", keys=DEFAULT_BLOCKING_KEYS)
    if not isinstance(keys_raw, list) or not keys_raw:
        raise LinkageSchemaError("blocking.keys", "expected a non-empty list of { field, first }")
    keys = []
    for i, entry in enumerate(keys_raw):
        where = f"blocking.keys[{i}]"
        if not isinstance(entry, Mapping):
            raise LinkageSchemaError(where, "expected a table { field = ..., first = ... }")
        _no_unknown_keys(entry, _KEY_KEYS, where + ".")
        name = entry.get("field")
        if name not in IDENTIFIER_COLUMNS:
            raise LinkageSchemaError(
                where + ".field",
                f"{name!r} is not an identifier column; use one of {IDENTIFIER_COLUMNS}",
            )
        first = _integer(entry.get("first", 0), where + ".first", 0, 64)
        keys.append(BlockingKey(name, first))
    if len(set(keys)) != len(keys):
        raise LinkageSchemaError("blocking.keys", "a key is listed twice; keep one")
    return Blocking("keys", keys=tuple(keys))


def _integer(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LinkageSchemaError(where, f"expected an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise LinkageSchemaError(where, f"{value} is outside {low}..{high}")
    return value


def _no_unknown_keys(table: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    unknown = sorted(str(k) for k in table if k not in allowed)
    if unknown:
        raise LinkageSchemaError(
            prefix + unknown[0], f"unknown key; the allowed keys are {sorted(allowed)}"
        )
