"""A site's identifier table encoded with clkhash: one keyed Bloom filter (CLK) per record.

:func:`encode` checks the identifier table's normal forms (the interface with
``harmonize``: string columns, missing = ``""``), hands the schema's columns to
``clkhash.clk.generate_clks`` under the secret the sites share, and returns the
encodings as an ``n x length/8`` array of bytes, record positions in the table's order.
The encodings carry no patient id: the site keeps the position -> patient map.

With ``blocking.method = "keys"`` each record also gets one keyed blocking token per key:
the first 8 bytes of HMAC-SHA256 (RFC 2104) of the key's value, under a key derived from
the secret by HKDF (RFC 5869) with its own ``info``, so it is independent of clkhash's
keys; a missing value gets no token (0).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import numpy as np
import pandas as pd
from bitarray import bitarray
from clkhash import clk
from clkhash import schema as clkhash_schema
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from linkage.errors import IdentifierError, SecretError
from linkage.schema import SEX_CODES, LinkageSchema

MIN_SECRET_BYTES = 16
"""A secret shorter than 128 bits could be found by trying them all."""

_NAME = r"[a-z]+(?: [a-z]+)*"
_PATTERNS = {
    "given_name": _NAME,
    "family_name": _NAME,
    "birth_date": r"\d{4}-\d{2}-\d{2}",
    "postal_code": r"[A-Z0-9]+",
}
_NORMAL_FORMS = {
    "given_name": "lowercase a-z words separated by one space",
    "family_name": "lowercase a-z words separated by one space",
    "birth_date": "a full date YYYY-MM-DD",
    "sex": f"one of {SEX_CODES}",
    "postal_code": "uppercase letters and digits",
}
_BLOCKING_INFO = b"fedstats linkage blocking keys v1"


@dataclass(frozen=True, eq=False)
class Encodings:
    """One party's encodings, as the linkage unit receives them.

    Attributes
    ----------
    clks
        ``uint8`` array of shape ``(n, length // 8)``: row i is the CLK of the record at
        position i of the identifier table (bit order: clkhash's big-endian bitarray).
    fingerprint
        :meth:`LinkageSchema.fingerprint` of the schema they were made under.
    blocking_tokens
        ``uint64`` array ``(n, number of keys)`` of keyed blocking tokens (0 = value
        missing), or None unless the schema blocks on keys.
    """

    clks: np.ndarray
    fingerprint: str
    blocking_tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.clks.shape[0])

    def bitarrays(self) -> list[bitarray]:
        """The CLKs as bitarrays (what anonlink's similarity functions take)."""
        out = []
        for row in self.clks:
            bits = bitarray(endian="big")
            bits.frombytes(row.tobytes())
            out.append(bits)
        return out


def encode(
    identifiers: pd.DataFrame,
    schema: LinkageSchema,
    secret: bytes,
    *,
    workers: int = 1,
) -> Encodings:
    """Encode every row of an identifier table into a CLK under ``secret``.

    Parameters
    ----------
    identifiers
        One row per patient; string columns named as in the schema, normalised
        (:data:`linkage.schema.IDENTIFIER_COLUMNS`), missing values as ``""``.
    schema
        The study's linkage schema.
    secret
        The key the linking sites share (at least 16 bytes). It never comes from, and
        never goes to, the coordinator or the linkage unit.
    workers
        Processes clkhash encodes with (it uses processes only from 10,000 rows).

    Returns
    -------
    Encodings
        Row i is the encoding of the table's i-th row.

    Raises
    ------
    IdentifierError
        A column is missing, holds a non-string or a value not in its normal form.
    SecretError
        The secret is not bytes or shorter than 16 bytes.
    """
    if not isinstance(secret, bytes | bytearray) or len(secret) < MIN_SECRET_BYTES:
        raise SecretError(
            f"the linkage secret must be at least {MIN_SECRET_BYTES} random bytes "
            "(e.g. secrets.token_bytes(32)), shared by the linking sites only"
        )
    if not isinstance(identifiers, pd.DataFrame):
        raise IdentifierError("(table)", "expected a pandas DataFrame, one row per patient")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    columns = _checked_columns(identifiers, schema)
    rows = list(zip(*(columns[name] for name in schema.columns), strict=True))
    parsed = clkhash_schema.from_json_dict(schema.clkhash_dict())
    filters = clk.generate_clks(rows, parsed, bytes(secret), validate=True, max_workers=workers)
    data = b"".join(f.tobytes() for f in filters)
    clks = np.frombuffer(data, dtype=np.uint8).reshape(len(rows), schema.length_bytes).copy()
    clks.setflags(write=False)
    tokens = None
    if schema.blocking.method == "keys":
        tokens = _blocking_tokens(columns, schema, bytes(secret), len(rows))
    return Encodings(clks=clks, fingerprint=schema.fingerprint(), blocking_tokens=tokens)


def check_identifiers(identifiers: pd.DataFrame, schema: LinkageSchema) -> None:
    """Check that an identifier table can be encoded under ``schema``, encoding nothing.

    The checks of :func:`encode` (every column the schema or its blocking keys read is
    present, holds strings, and each value is in its normal form), for a site to run once
    when it loads the table rather than when a linkage is under way.

    Raises
    ------
    IdentifierError
        Naming the column and the index label of the first bad row.
    """
    if not isinstance(identifiers, pd.DataFrame):
        raise IdentifierError("(table)", "expected a pandas DataFrame, one row per patient")
    _checked_columns(identifiers, schema)


def _checked_columns(identifiers: pd.DataFrame, schema: LinkageSchema) -> dict[str, list[str]]:
    return {name: _checked_column(identifiers, name) for name in _read_columns(schema)}


def _read_columns(schema: LinkageSchema) -> list[str]:
    names = list(schema.columns)
    for key in schema.blocking.keys if schema.blocking.method == "keys" else ():
        if key.field not in names:
            names.append(key.field)
    return names


def _checked_column(identifiers: pd.DataFrame, name: str) -> list[str]:
    if name not in identifiers.columns:
        raise IdentifierError(name, "missing; the linkage schema encodes it (use '' for unknown)")
    column = identifiers[name]
    not_string = ~column.map(lambda v: isinstance(v, str)).astype(bool)
    if not_string.any():
        row = column.index[np.argmax(not_string.to_numpy())]
        raise IdentifierError(name, "not a string; write a missing value as ''", row)
    values = column.astype(str)
    present = values != ""
    if name == "sex":
        good = values.isin(SEX_CODES) | ~present
    else:
        good = values.str.fullmatch(_PATTERNS[name]) | ~present
        if name == "birth_date":
            dates = pd.to_datetime(values.where(present & good), format="%Y-%m-%d", errors="coerce")
            good &= dates.notna() | ~present
    if not good.all():
        row = values.index[np.argmax(~good.to_numpy())]
        raise IdentifierError(name, f"not in normal form: expected {_NORMAL_FORMS[name]}", row)
    return values.tolist()


def _blocking_tokens(
    columns: dict[str, list[str]], schema: LinkageSchema, secret: bytes, n: int
) -> np.ndarray:
    salt = schema.salt.encode("utf-8") if schema.salt is not None else None
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_BLOCKING_INFO).derive(secret)
    keys = schema.blocking.keys
    tokens = np.zeros((n, len(keys)), dtype=np.uint64)
    for j, blocking_key in enumerate(keys):
        label = f"{blocking_key.field}:{blocking_key.first}:".encode()
        for i, value in enumerate(columns[blocking_key.field]):
            if not value:
                continue
            part = value[: blocking_key.first] if blocking_key.first else value
            digest = hmac.new(key, label + part.encode("utf-8"), hashlib.sha256).digest()
            tokens[i, j] = int.from_bytes(digest[:8], "big") or 1
    tokens.setflags(write=False)
    return tokens
