"""The linkage record: what a record linkage leaves in the study directory for the report.

One definition for both ends: the linkage unit's run (``fedstats.link``) checks the record
here before it writes ``linkages/<linkage_id>.json`` (:func:`checked_linkage_record`),
and ``reports`` reads it as :class:`LinkageRecord` for the compliance report's linkage
section: what each site encoded (fields, n-grams, bits, hardening: never a value), the
threshold and blocking, how many records each site sent and how many were linked, and
the match-score histogram. Counts from 1 to k - 1 are written as ``None`` (suppressed)
by the writer, and a record holding one is refused, so no small cell reaches a report.
A record that does not match names every bad field
(:class:`~studyfiles.errors.LinkageRecordError`). Unknown fields are kept by the writer
and ignored by the reader, so a record written by a newer package still loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from studyfiles.errors import LinkageRecordError

__all__ = [
    "LinkageRecord",
    "LinkageSiteRecord",
    "checked_linkage_record",
    "suppressed",
]


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


def suppressed(count: int, k: int) -> int | None:
    """``count`` as a record may show it: ``None`` from 1 to ``k - 1`` (a small cell)."""
    return None if 0 < count < k else count


class LinkageSiteRecord(_Record):
    """One site's part of a linkage: records it encoded, records linked, never a value."""

    site: str
    role: str
    """``"outcome"`` (the registry), ``"covariates"`` (a hospital) or ``"party"``."""
    records_sent: int | None
    linked: int | None
    never_compared: int | None = None
    """Records that shared no blocking key with any record of the other site."""


class LinkageRecord(_Record):
    """A record linkage between two sites, as the linkage unit ran it."""

    linkage_id: str
    created: datetime
    schema_fingerprint: str
    """SHA-256 of the linkage schema both sites encoded under (``linkage.LinkageSchema``)."""
    fields: list[dict[str, Any]]
    """Per identifier field: name, n-gram size, bits, positional: the encoding, no values."""
    length: int
    hash_type: str
    xor_folds: int
    threshold: float
    blocking: dict[str, Any]
    """The blocking method and its keys (what the linkage unit could group records by)."""
    secret: str
    """Where the sites' shared secret came from, e.g. ``"X25519 agreement signed with the
    sites' pinned roster keys"``: the secret itself is never recorded."""
    sites: list[LinkageSiteRecord]
    pairs: int | None
    candidate_pairs: int
    score_edges: list[float]
    score_counts: list[int | None]
    """Linked pairs per score bin (bins ``score_edges``), counts 1..k-1 suppressed."""
    k: int
    """The disclosure threshold the counts were suppressed at."""

    @model_validator(mode="after")
    def _no_small_cells(self) -> LinkageRecord:
        counts = [self.pairs, *self.score_counts]
        counts += [c for s in self.sites for c in (s.records_sent, s.linked, s.never_compared)]
        small = [c for c in counts if c is not None and 0 < c < self.k]
        if small:
            raise ValueError(f"counts {small} are below k = {self.k}: write them as null")
        if len(self.score_edges) != len(self.score_counts) + 1:
            raise ValueError("score_edges must have one more entry than score_counts")
        return self


def checked_linkage_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` as a JSON-ready dict once it matches :class:`LinkageRecord`.

    Raises
    ------
    LinkageRecordError
        Naming every field that does not match (at most five) and what it should be.
    """
    try:
        LinkageRecord.model_validate_json(json.dumps(dict(record), default=str), strict=False)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}"
            for e in error.errors()[:5]
        )
        raise LinkageRecordError(f"linkage record does not match its format: {problems}") from None
    return dict(record)
