"""The linkage unit: the coordinator links two sites' patients over the wire.

:func:`link` runs :mod:`fedstats.contract.tasks.record_linkage` between two sites:

1. ``linkage.advertise`` at both: each site's fresh X25519 public key, signed with its
   pinned roster key, and the number of records it will encode;
2. ``linkage.encode`` at both, each given the other's signed advert as it came: each site
   checks the signature against its own pinned roster, derives the secret both share
   (X25519 then HKDF-SHA256; the linkage unit relays two public keys and never holds the
   secret: "the study PKI carries the secret") and replies its keyed Bloom-filter
   encodings (CLKs; Schnell, Bachteler and Reiher 2011) and blocking tokens, in an order
   of its own drawing;
3. the linkage unit matches them (:func:`linkage.link`: blocking, Dice similarity at the
   schema's threshold, one-to-one greedy solve, pair ids in a random order);
4. ``linkage.accept`` at both: each site gets only its own record positions and their pair
   ids, and accepts them as linked rows (its refusals: fewer than ``min_count`` pairs,
   repeats, differencing against the linkages it accepted).

A registry linked to several hospitals takes one call per hospital, each with its own
linkage id. What the linkage unit learns: the number of records at each site, which of
them link (as positions in orders it cannot read) and their scores, and the CLKs
themselves, open to the frequency and pattern-mining attacks of Christen et al. (2017,
2018) that :mod:`linkage.schema` describes; never an identifier value, nor the secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import linkage
from fedstats.contract.tasks import record_linkage as wire
from fedstats.errors import StudyConfigurationError
from fedstats.models.federation import Federation
from linkage.quality import score_histogram
from studyfiles.durable import write_json_atomically
from studyfiles.linkage_records import checked_linkage_record, suppressed
from studyfiles.names import name_problem

DEFAULT_K = 10
"""The disclosure threshold the result's counts are suppressed at (1..k-1 shown as None):
the sites' default ``min_count``."""
SECRET_SOURCE = (
    "X25519 agreement (HKDF-SHA256) between the two sites' fresh keys, each signed with the "
    "site's pinned roster key and checked by the other; derived at the sites only, never "
    "held by the linkage unit"
)
"""Where the sites' shared secret came from, as the linkage record says it (never the
secret)."""
ROLES = ("outcome", "covariates", "party")


@dataclass(frozen=True)
class LinkageResult:
    """What a linkage run leaves with the linkage unit.

    Attributes
    ----------
    linkage_id, sites, fingerprint
        The linkage, its two sites (in the order given) and its schema's fingerprint.
    pairs
        Linked pairs (each site accepted them).
    records, linked, never_compared
        Per site: records it encoded, records linked, records that shared no blocking key
        with any record of the other site.
    candidate_pairs
        Pairs of records the linkage unit scored.
    score_histogram
        Linked pairs by Dice score, ``{"low", "high", "count"}`` per bin from the threshold
        to 1, counts from 1 to ``k - 1`` suppressed (``None``).
    k
        The suppression threshold.
    record_path
        The linkage record written in the study directory, if one was given.
    """

    linkage_id: str
    sites: tuple[str, str]
    fingerprint: str
    pairs: int
    records: dict[str, int]
    linked: dict[str, int]
    never_compared: dict[str, int]
    candidate_pairs: int
    score_histogram: list[dict[str, float | int | None]]
    k: int
    record_path: Path | None = field(default=None)

    def __repr__(self) -> str:
        first, second = self.sites
        return (
            f"LinkageResult({self.linkage_id!r}: {self.pairs} pairs between {first!r} "
            f"({self.records[first]} records) and {second!r} ({self.records[second]} records))"
        )


def link(
    federation: Federation,
    *,
    first: str,
    second: str,
    linkage_id: str,
    schema: linkage.LinkageSchema | Mapping[str, Any],
    roles: Mapping[str, str] | None = None,
    record_dir: str | Path | None = None,
    k: int = DEFAULT_K,
    bins: int = 10,
    seed: int | None = None,
) -> LinkageResult:
    """Link the patients of two sites; each site accepts its side as linked rows.

    Parameters
    ----------
    federation
        The study's federation; both sites must be in it.
    first, second
        The two sites (e.g. the registry, then one hospital).
    linkage_id
        A new id for this linkage (1-100 letters, digits, ``.``, ``_``, ``-``); the vertical
        fit names it (``VerticalLogisticRegression(..., linkage_id=...)``).
    schema
        The study specification's ``[linkage]`` table (``StudySpec.linkage``) or its
        :class:`linkage.LinkageSchema`: the one both sites encode under (each checks the
        fingerprint against its own copy and refuses another).
    roles
        Each site's role for the record: ``"outcome"``, ``"covariates"`` or ``"party"``
        (default).
    record_dir
        The study directory: the linkage record is written to
        ``<record_dir>/linkages/<linkage_id>.json``
        (:func:`studyfiles.linkage_records.checked_linkage_record`).
    k
        Counts from 1 to ``k - 1`` in the result and the record are suppressed.
    bins
        Bins of the score histogram.
    seed
        Seeds the order of pair ids (tests); OS entropy by default.

    Returns
    -------
    LinkageResult

    Raises
    ------
    StudyConfigurationError
        Bad arguments, or the sites' adverts disagree with the schema.
    fedstats.SiteError
        A site refused a step (its error names the site, the task and the rule).
    """
    try:
        schema = wire.linkage_schema(schema)
    except linkage.LinkageSchemaError as error:
        raise StudyConfigurationError(str(error)) from None
    sites = (first, second)
    _check_arguments(federation, sites, linkage_id, roles, k)
    fingerprint = schema.fingerprint()
    analysis = federation.new_analysis("linkage")
    base = {"study": federation.study, "linkage": linkage_id, "sites": list(sites),
            "fingerprint": fingerprint}  # fmt: skip

    def ask(site: str, task: str, args: Mapping[str, Any]) -> dict[str, Any]:
        return federation.request(task, {**base, **args}, analysis=analysis, sites=[site])[site]

    adverts = {site: ask(site, wire.ADVERTISE, {}) for site in sites}
    token_keys = len(schema.blocking.keys) if schema.blocking.method == "keys" else 0
    encodings = {}
    for site, other in ((first, second), (second, first)):
        peer = {"public_key": np.asarray(adverts[other]["public_key"], dtype=np.uint8),
                "signature": adverts[other]["signature"]}  # fmt: skip
        reply = ask(site, wire.ENCODE, {"records": int(adverts[site]["records"]),
                                        "clk_bytes": schema.length_bytes,
                                        "token_keys": token_keys, "peer": peer})  # fmt: skip
        tokens = reply["tokens"] if schema.blocking.method == "keys" else None
        encodings[site] = linkage.Encodings(reply["clks"], fingerprint, tokens)
    matched = linkage.link(encodings[first], encodings[second], schema, seed=seed)
    for site, side in ((first, matched.first), (second, matched.second)):
        mapping = {"linkage": linkage_id, "positions": side.positions, "pair_ids": side.pair_ids}
        federation.request(wire.ACCEPT, mapping, analysis=analysis, sites=[site])
    result = LinkageResult(
        linkage_id=linkage_id,
        sites=sites,
        fingerprint=fingerprint,
        pairs=len(matched.first),
        records={site: len(encodings[site]) for site in sites},
        linked={first: len(matched.first), second: len(matched.second)},
        never_compared=dict(zip(sites, matched.unblocked, strict=True)),
        candidate_pairs=matched.candidates,
        score_histogram=score_histogram(matched.first.scores, schema.threshold, bins=bins, k=k),
        k=k,
    )
    if record_dir is None:
        return result
    path = Path(record_dir) / "linkages" / f"{linkage_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, linkage_record(result, schema, roles or {}))
    return replace(result, record_path=path)


def linkage_record(
    result: LinkageResult, schema: linkage.LinkageSchema, roles: Mapping[str, str]
) -> dict[str, Any]:
    """The record of ``result`` (:class:`studyfiles.linkage_records.LinkageRecord`): the
    encoding's settings, never a value; counts from 1 to k - 1 written as ``None``."""
    k = result.k
    histogram = result.score_histogram
    blocking: dict[str, Any] = {"method": schema.blocking.method}
    if schema.blocking.method == "keys":
        blocking["keys"] = [{"field": b.field, "first": b.first} for b in schema.blocking.keys]
    elif schema.blocking.method == "bits":
        blocking |= {"tables": schema.blocking.tables, "bits": schema.blocking.bits,
                     "seed": schema.blocking.seed}  # fmt: skip
    record = {
        "linkage_id": result.linkage_id,
        "created": datetime.now(UTC).isoformat(),
        "schema_fingerprint": result.fingerprint,
        "fields": [_field(f) for f in schema.fields],
        "length": schema.length,
        "hash_type": "blakeHash" if schema.hash == "blake" else "doubleHash",
        "xor_folds": schema.xor_folds,
        "threshold": schema.threshold,
        "blocking": blocking,
        "secret": SECRET_SOURCE,
        "sites": [
            {
                "site": site,
                "role": roles.get(site, "party"),
                "records_sent": suppressed(result.records[site], k),
                "linked": suppressed(result.linked[site], k),
                "never_compared": suppressed(result.never_compared[site], k),
            }
            for site in result.sites
        ],
        "pairs": suppressed(result.pairs, k),
        "candidate_pairs": result.candidate_pairs,
        "score_edges": [b["low"] for b in histogram] + [histogram[-1]["high"]],
        "score_counts": [b["count"] for b in histogram],
        "k": k,
    }
    return checked_linkage_record(record)


def _field(encoding: Any) -> dict[str, Any]:
    return {
        "name": encoding.name,
        "ngram": encoding.ngram,
        "bits": encoding.bits,
        "positional": encoding.positional,
        "per_token": encoding.per_token,
    }


def _check_arguments(
    federation: Federation,
    sites: tuple[str, str],
    linkage_id: str,
    roles: Mapping[str, str] | None,
    k: int,
) -> None:
    if not isinstance(federation, Federation):
        raise StudyConfigurationError(
            f"link() needs a fedstats.Federation, got {type(federation).__name__}"
        )
    if sites[0] == sites[1] or any(s not in federation.sites for s in sites):
        raise StudyConfigurationError(
            f"link() needs two distinct sites of the federation {federation.sites}, got "
            f"{list(sites)}"
        )
    problem = name_problem(linkage_id)
    if problem is not None:
        raise StudyConfigurationError(f"linkage_id: {problem}")
    bad = {s: r for s, r in (roles or {}).items() if s not in sites or r not in ROLES}
    if bad:
        raise StudyConfigurationError(f"roles must give the linked sites one of {ROLES}, got {bad}")
    if type(k) is not int or k < 1:
        raise StudyConfigurationError(f"k must be a positive integer, got {k!r}")
