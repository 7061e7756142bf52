"""One secure-aggregation session on the wire: its plan, its graph and its rounds' compact fields.

A session's *plan* (:class:`SessionPlan`) is what the coordinator sends every site in the
first round and every site signs in its key advertisement: the session id, its sites in
order, the construction (``"secagg+"``: Bell et al., CCS 2020; ``"secagg"``: the complete
graph of Bonawitz et al., CCS 2017), the threshold ``t`` and the fixed-point precision. From
``(n, t)`` both sides compute the graph's degree and per-neighbourhood threshold
(:func:`fedstats.secagg.graph.neighbourhood`); the coordinator chooses neither.

The graph's ring order is drawn from a seed no party chooses: the SHA-256 of the *first*
site's signed advertisement (:meth:`SessionPlan.graph`), which holds two X25519 public keys
that site drew afresh for the session. The coordinator fixes the session's sites and order
before any key exists and cannot alter that site's keys (every site checks its signature
against the key it pinned), so it can neither choose the graph nor, without restarting the
session with all its sites, draw another.

Every field is sized by the request (:func:`share_schema`, :func:`unmask_schema`) and
carried raw in ``uint8`` arrays through the codec (keys 32 bytes, sealed shares 160 bytes,
signatures :data:`SIGNATURE_BYTES`): each site receives only what is addressed to it —
its neighbours' signed keys, the shares sealed for it, the survivor set with its
signatures — and never the ``n x n`` matrix of shares.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from fedstats.errors import StudyConfigurationError
from fedstats.schema import Array, ReplySchema
from fedstats.secagg import crypto, graph, ring, roster, shamir

CONSTRUCTIONS = ("secagg+", "secagg")
"""``secagg+``: a Harary graph of logarithmic degree (complete for few sites); ``secagg``:
always the complete graph."""

MAX_SITES = 256

KEYS_BYTES = 2 * crypto.KEY_BYTES
"""A site's two public keys, encryption then masking."""

SIGNATURE_BYTES = 1 + 72
"""A signature's length byte, then Ed25519 (64 bytes) or DER ECDSA P-256 (at most 72),
zero-padded; length 0 for a site without a pinned roster."""

SEALED_BYTES = crypto.NONCE_BYTES + 2 * shamir.SHARE_BYTES + crypto.TAG_BYTES
"""One sealed share pair: nonce, the key share and the seed share, the GCM tag."""


def majority(parties: int) -> int:
    """The smallest threshold allowed: a strict majority of the session's sites."""
    return parties // 2 + 1


def check_threshold(threshold: Any, parties: int) -> None:
    if not isinstance(threshold, int) or isinstance(threshold, bool):
        raise StudyConfigurationError(f"the threshold must be an integer, got {threshold!r}")
    if not majority(parties) <= threshold <= parties or threshold < 2:
        raise StudyConfigurationError(
            f"the secure-aggregation threshold must be at least 2 and a majority of the "
            f"{parties} sites ({majority(parties)}..{parties}), got {threshold}"
        )


def check_construction(construction: Any) -> str:
    if construction not in CONSTRUCTIONS:
        raise StudyConfigurationError(
            f"the secure-aggregation construction must be one of {CONSTRUCTIONS}, "
            f"got {construction!r}"
        )
    return construction


@dataclass(frozen=True)
class SessionPlan:
    """What every site of a session agrees to, and signs, in the first round."""

    session: str
    sites: tuple[str, ...]
    construction: str
    threshold: int
    fraction_bits: int

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> SessionPlan:
        """The plan of an advertise request; ``ValueError`` naming what is wrong."""
        session, sites = args.get("session"), args.get("sites")
        if not (isinstance(session, str) and 16 <= len(session) <= 64):
            raise ValueError("the session id must be 16 to 64 characters")
        if (
            not isinstance(sites, list)
            or not all(isinstance(s, str) for s in sites)
            or len(set(sites)) != len(sites)
            or not 2 <= len(sites) <= MAX_SITES
        ):
            raise ValueError(f"sites must list 2 to {MAX_SITES} distinct site names")
        try:
            construction = check_construction(args.get("construction"))
            check_threshold(args.get("threshold"), len(sites))
            ring.check_fraction_bits(args.get("fraction_bits"))
        except StudyConfigurationError as error:
            raise ValueError(str(error)) from None
        return cls(session, tuple(sites), construction, args["threshold"], args["fraction_bits"])

    def to_args(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "sites": list(self.sites),
            "construction": self.construction,
            "threshold": self.threshold,
            "fraction_bits": self.fraction_bits,
        }

    @cached_property
    def shape(self) -> graph.Neighbourhood:
        """The graph's degree ``k`` and per-neighbourhood threshold ``t_k``."""
        n = len(self.sites)
        if self.construction == "secagg":
            return graph.complete(n, self.threshold)
        return graph.neighbourhood(n, self.threshold)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.sites)}

    def point(self, site: str) -> int:
        """``site``'s Shamir point: its place in the session's order, from 1."""
        return self._index[site] + 1

    @property
    def contributor(self) -> str:
        """The site whose advertisement seeds the graph: the session's first."""
        return self.sites[0]

    def advert(self, site: str, keys: bytes) -> bytes:
        """The bytes ``site`` signs for its two public keys in this session."""
        return roster.advert_message(
            self.session,
            site,
            self.sites,
            self.threshold,
            self.fraction_bits,
            keys[: crypto.KEY_BYTES].hex(),
            keys[crypto.KEY_BYTES :].hex(),
            construction=self.construction,
        )

    def graph_seed(self, contributor_keys: bytes) -> bytes:
        """SHA-256 of the first site's advertisement: the seed of the session's ring."""
        advert = self.advert(self.contributor, contributor_keys)
        return hashlib.sha256(b"fedstats secagg graph v1" + advert).digest()

    def graph(self, contributor_keys: bytes) -> graph.Graph:
        """The session's graph, its ring drawn from the first site's advertisement."""
        return graph.session_graph(self.sites, self.shape, self.graph_seed(contributor_keys))

    def survivors_message(self, survivors: Iterable[str]) -> bytes:
        """What a survivor signs in the consistency round: the session and its survivor set."""
        members = set(survivors)
        return json.dumps(
            [
                "fedstats secagg survivors v1",
                self.session,
                list(self.sites),
                [s for s in self.sites if s in members],
            ],
            separators=(",", ":"),
        ).encode()

    def bitmap(self, members: Iterable[str]) -> np.ndarray:
        """A subset of the session's sites as bits in session order."""
        chosen = set(members)
        return np.packbits(np.array([s in chosen for s in self.sites], dtype=bool))

    def members(self, bits: Any) -> tuple[str, ...]:
        """The sites a :meth:`bitmap` names; ``ValueError`` when it is not one."""
        size = (len(self.sites) + 7) // 8
        if not (isinstance(bits, np.ndarray) and bits.dtype == np.uint8 and bits.shape == (size,)):
            raise ValueError(f"a site set must be {size} bytes of bits")
        flags = np.unpackbits(bits)
        if flags[len(self.sites) :].any():
            raise ValueError("a site set names places beyond the session's sites")
        return tuple(s for s, on in zip(self.sites, flags, strict=False) if on)


# --- raw fields ----------------------------------------------------------------------------


def rows(items: Sequence[bytes], width: int) -> np.ndarray:
    """Byte strings of one length as the rows of a ``uint8`` array."""
    out = np.zeros((len(items), width), dtype=np.uint8)
    for i, item in enumerate(items):
        if len(item) != width:
            raise ValueError(f"row {i} has {len(item)} bytes, not {width}")
        out[i] = np.frombuffer(item, dtype=np.uint8)
    return out


def row_bytes(value: Any, count: int, width: int, what: str) -> list[bytes]:
    """The rows of a ``uint8`` array of shape ``(count, width)``; ``ValueError`` otherwise."""
    if not (
        isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.shape == (count, width)
    ):
        raise ValueError(f"{what} must be {count} rows of {width} bytes")
    return [bytes(row) for row in value]


def signature_row(signature_hex: str) -> bytes:
    """A signature (hex, as the roster makes it) as one :data:`SIGNATURE_BYTES` row."""
    raw = bytes.fromhex(signature_hex)
    return bytes([len(raw)]) + raw + bytes(SIGNATURE_BYTES - 1 - len(raw))


def signature_hex(row: bytes) -> str:
    """The signature a :func:`signature_row` holds, as hex; ``ValueError`` when malformed."""
    length = row[0]
    if length > SIGNATURE_BYTES - 1 or any(row[1 + length :]):
        raise ValueError("a signature row is malformed")
    return row[1 : 1 + length].hex()


@dataclass(frozen=True)
class Adverts:
    """Signed advertisements relayed to a site: each site's two public keys and signature."""

    keys: dict[str, bytes]
    signatures: dict[str, str]

    def to_wire(self) -> dict[str, Any]:
        names = list(self.keys)
        return {
            "sites": names,
            "keys": rows([self.keys[s] for s in names], KEYS_BYTES),
            "signatures": rows([signature_row(self.signatures[s]) for s in names], SIGNATURE_BYTES),
        }

    @classmethod
    def from_wire(cls, value: Any) -> Adverts:
        """``ValueError`` naming what is wrong."""
        if not (isinstance(value, dict) and set(value) == {"sites", "keys", "signatures"}):
            raise ValueError("adverts must hold 'sites', 'keys' and 'signatures'")
        names = value["sites"]
        if not (
            isinstance(names, list)
            and all(isinstance(s, str) for s in names)
            and len(set(names)) == len(names)
        ):
            raise ValueError("adverts must name distinct sites")
        keys = row_bytes(value["keys"], len(names), KEYS_BYTES, "keys")
        signed = row_bytes(value["signatures"], len(names), SIGNATURE_BYTES, "signatures")
        return cls(
            dict(zip(names, keys, strict=True)),
            {s: signature_hex(r) for s, r in zip(names, signed, strict=True)},
        )


# --- reply schemas -------------------------------------------------------------------------


def advertise_schema(args: dict[str, Any]) -> ReplySchema:
    return {"keys": Array((KEYS_BYTES,)), "signature": Array((SIGNATURE_BYTES,))}


def share_schema(args: dict[str, Any]) -> ReplySchema:
    """One sealed share pair for each neighbour whose advertisement was relayed."""
    adverts = args.get("neighbours")
    names = adverts.get("sites") if isinstance(adverts, dict) else None
    count = len(names) if isinstance(names, list) else 0
    return {"sealed": Array((count, SEALED_BYTES))}


def confirm_schema(args: dict[str, Any]) -> ReplySchema:
    return {"signature": Array((SIGNATURE_BYTES,))}


def unmask_schema(args: dict[str, Any]) -> ReplySchema:
    """One share for each of the site's holders (itself and its neighbours)."""
    holders = args.get("holders")
    count = holders if isinstance(holders, int) and not isinstance(holders, bool) else 0
    return {"shares": Array((max(count, 0), shamir.SHARE_BYTES))}
