"""The wire of a record linkage between two sites, run by the coordinator as linkage unit.

Two sites (a registry and a hospital) link their patients without either learning the
other's identifiers, and without the linkage unit learning the secret their encodings are
keyed with (Schnell, Bachteler and Reiher 2011; :mod:`linkage`):

1. ``linkage.advertise`` (each site): a fresh X25519 key pair (RFC 7748) for this linkage
   id, the two sites in order and the fingerprint of the site's own ``[linkage]`` schema;
   the reply is its public key and the number of records it will encode, signed with the
   key the study's roster pins for the site, over :func:`advert_statement`.
2. ``linkage.encode`` (each site): the other site's signed advert relayed; the site checks
   the signature with the key *it* pinned for the other site, derives the shared secret
   ``HKDF-SHA256(X25519(own, other), info = session)`` (:func:`session`;
   :func:`fedstats.secagg.crypto.agreed_key`), which the coordinator relaying the two
   public keys cannot compute (Diffie and Hellman 1976), and replies the CLKs and keyed
   blocking tokens of its identifier table in an order of its own drawing. Once per
   linkage id.
3. ``linkage.accept`` (each site): the linkage unit's mapping for this site, record
   positions (in the order the site sent) and pair ids; the site turns positions into its
   patients and accepts the linkage (:mod:`fedstats.site.linked_rows`).

The encode reply is the second reply whose size is the number of patients
(:class:`fedstats.schema.RecordCodes`; checked at the site by
:mod:`fedstats.site.encoding_replies`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import linkage
from fedstats.contract.task_spec import TaskSpec
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number, RecordCodes, Text
from studyfiles.names import name_problem

ADVERTISE = "linkage.advertise"
ENCODE = "linkage.encode"
ACCEPT = "linkage.accept"
TASK_NAMES = (ADVERTISE, ENCODE, ACCEPT)

KEY_BYTES = 32
"""Bytes of an X25519 public key."""
MAX_RECORDS = 2_000_000
"""The most records a site may be asked to encode, or a mapping may name."""
MAX_CLK_BYTES = 1024
"""Bytes of the longest encoding a ``[linkage]`` table allows (8192 bits)."""
MAX_TOKEN_KEYS = 64
MAX_NAME_CHARS = 200
SIGNATURE = Text(max_chars=200)
STATEMENT_KIND = "fedstats linkage advertisement v1"
PURPOSE = "linkage"
"""The purpose the shared secret is derived for (HKDF ``info``)."""
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


# ------------------------------------------------------------------ the schema


def linkage_schema(table: linkage.LinkageSchema | Mapping[str, Any]) -> linkage.LinkageSchema:
    """The study's linkage schema from its ``[linkage]`` table: as ``tomllib`` reads it, or
    as ``StudySpec.linkage`` keeps it (read-only tables and tuples, thawed here), or parsed.
    Raises :class:`linkage.LinkageSchemaError` naming the bad key."""
    if isinstance(table, linkage.LinkageSchema):
        return table
    return linkage.parse_linkage_table(_thawed(table))


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_thawed(item) for item in value]
    return value


# ------------------------------------------------------------------ what is signed, agreed


def advert_statement(
    study: str,
    linkage: str,
    sites: Sequence[str],
    fingerprint: str,
    signer: str,
    public_key: bytes,
) -> bytes:
    """The bytes a site signs over its advert: canonical JSON of the study, the linkage id,
    the two sites in order, the schema fingerprint, the signing site and its fresh public
    key (hex). Signed with the key the study's roster pins for the site."""
    return json.dumps(
        [STATEMENT_KIND, study, linkage, list(sites), fingerprint, signer, public_key.hex()],
        separators=(",", ":"),
    ).encode()


def session(study: str, linkage: str, sites: Sequence[str], fingerprint: str) -> str:
    """The session both sites bind their agreed secret to: study, linkage, sites, schema."""
    return json.dumps([study, linkage, list(sites), fingerprint], separators=(",", ":"))


# ------------------------------------------------------------------ arguments


def _refused(reason: str) -> MalformedRequestError:
    return MalformedRequestError(site=None, task=None, reason=reason)


def study_of(args: Mapping[str, Any]) -> str:
    """The request's ``study``: the study's name, bound into every signature."""
    value = args.get("study")
    if not (isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS):
        raise _refused("'study' must name the study")
    return value


def linkage_of(args: Mapping[str, Any]) -> str:
    """The request's ``linkage``: the linkage id (a safe file name: it names the record)."""
    value = args.get("linkage")
    problem = name_problem(value)
    if problem is not None:
        raise _refused(f"'linkage' must be a linkage id: {problem}")
    return value


def sites_of(args: Mapping[str, Any]) -> tuple[str, str]:
    """The request's ``sites``: the two linked sites, in the linkage unit's order."""
    value = args.get("sites")
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(s, str) and 0 < len(s) <= MAX_NAME_CHARS for s in value)
        and value[0] != value[1]
    ):
        raise _refused("'sites' must name the two linked sites, in order")
    return value[0], value[1]


def fingerprint_of(args: Mapping[str, Any]) -> str:
    """The request's ``fingerprint``: the linkage schema's SHA-256 (64 hex digits)."""
    value = args.get("fingerprint")
    if not (isinstance(value, str) and _FINGERPRINT.fullmatch(value)):
        raise _refused("'fingerprint' must be a linkage schema's SHA-256 (64 hex digits)")
    return value


def _integer(args: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = args.get(key)
    if type(value) is not int or not low <= value <= high:
        raise _refused(f"{key!r} must be an integer from {low} to {high}")
    return value


def records_of(args: Mapping[str, Any]) -> int:
    """The request's ``records``: how many records the site said it encodes."""
    return _integer(args, "records", 1, MAX_RECORDS)


def clk_bytes_of(args: Mapping[str, Any]) -> int:
    """The request's ``clk_bytes``: bytes of one encoding under the schema."""
    return _integer(args, "clk_bytes", 8, MAX_CLK_BYTES)


def token_keys_of(args: Mapping[str, Any]) -> int:
    """The request's ``token_keys``: blocking tokens per record (0 without key blocking)."""
    return _integer(args, "token_keys", 0, MAX_TOKEN_KEYS)


def peer_of(args: Mapping[str, Any]) -> tuple[bytes, str]:
    """The other site's advert as relayed: its public key (32 bytes) and signature."""
    value = args.get("peer")
    if not (
        isinstance(value, dict)
        and set(value) == {"public_key", "signature"}
        and isinstance(value["public_key"], np.ndarray)
        and value["public_key"].dtype == np.uint8
        and value["public_key"].shape == (KEY_BYTES,)
        and isinstance(value["signature"], str)
        and len(value["signature"]) <= SIGNATURE.max_chars
    ):
        raise _refused(
            f"'peer' must be the other site's signed advert: public_key ({KEY_BYTES} bytes) "
            "and signature"
        )
    return value["public_key"].tobytes(), value["signature"]


def mapping_of(args: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The request's ``positions`` and ``pair_ids``: one-dimensional integer arrays of one
    length (their ranges and repeats are the site's to check)."""
    positions, pair_ids = args.get("positions"), args.get("pair_ids")
    for value in (positions, pair_ids):
        if not (
            isinstance(value, np.ndarray)
            and value.ndim == 1
            and value.dtype.kind in "iu"
            and value.size <= MAX_RECORDS
        ):
            raise _refused("'positions' and 'pair_ids' must be one-dimensional integer arrays")
    if positions.shape != pair_ids.shape:
        raise _refused("'positions' and 'pair_ids' must have one entry per linked record")
    return positions.astype(np.int64), pair_ids.astype(np.int64)


# ------------------------------------------------------------------ schemas


def advertise_schema(args: dict[str, Any]) -> dict:
    study_of(args)
    linkage_of(args)
    sites_of(args)
    fingerprint_of(args)
    return {"public_key": Array((KEY_BYTES,)), "records": Number(), "signature": SIGNATURE}


def encode_schema(args: dict[str, Any]) -> dict:
    study_of(args)
    linkage_of(args)
    sites_of(args)
    fingerprint_of(args)
    peer_of(args)
    records = records_of(args)
    return {
        "clks": RecordCodes(records, clk_bytes_of(args), "uint8"),
        "tokens": RecordCodes(records, token_keys_of(args), "uint64"),
    }


def accept_schema(args: dict[str, Any]) -> dict:
    linkage_of(args)
    mapping_of(args)
    return {"pairs": Number()}


ADVERTISE_SPEC = TaskSpec(
    name=ADVERTISE,
    schema=advertise_schema,
    description="record linkage: a fresh X25519 key for one linkage and the records it will "
    "encode, signed with the site's roster key",
)
ENCODE_SPEC = TaskSpec(
    name=ENCODE,
    schema=encode_schema,
    description="record linkage: the site's identifiers as keyed Bloom-filter encodings and "
    "blocking tokens, under the secret agreed with the other site's signed key; once",
)
ACCEPT_SPEC = TaskSpec(
    name=ACCEPT,
    schema=accept_schema,
    description="record linkage: the linkage unit's positions and pair ids, accepted as the "
    "site's linked rows",
)
SPECS = (ADVERTISE_SPEC, ENCODE_SPEC, ACCEPT_SPEC)
