"""What a site links on: its identifier table, its own linkage schema, and its linkages' keys.

Site-local inputs, never from a request: the identifier table of the frame's patients
(``harmonize``'s ``Harmonized.identifiers``: one row per frame patient, same index, the
normal forms of :data:`linkage.schema.IDENTIFIER_COLUMNS`) and the ``[linkage]`` table of
the site's own copy of the study specification (``StudySpec.linkage``), parsed into a
:class:`linkage.LinkageSchema`. A request naming another schema fingerprint is refused
(:mod:`fedstats.site.handlers.record_linkage`).

For each linkage id the site keeps a :class:`LinkageSession`: its ephemeral X25519 key
(dropped once it has encoded: the secret cannot be derived again), whether it has encoded,
and the order it drew (position -> patient), which the linkage unit's mapping is read in.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import linkage
from fedstats.contract.tasks.record_linkage import linkage_schema
from fedstats.errors import StudyConfigurationError

MAX_LINKAGES = 1_000
"""The most linkage ids a site takes part in (its keys and orders are kept in memory);
further adverts are refused, nothing is forgotten."""


@dataclass
class LinkageSession:
    """One linkage as this site takes part in it (never sent as such)."""

    study: str
    sites: tuple[str, str]
    fingerprint: str
    private_key: X25519PrivateKey | None
    public_key: bytes
    signature: str
    encoded: bool = False
    patients: np.ndarray | None = None
    """The frame index label of the record at each position the site sent (after encoding)."""


@dataclass
class SiteIdentifiers:
    """A site's identifier table, linkage schema and linkage sessions.

    Build it with :func:`site_identifiers`, which checks the table against the frame and the
    schema.
    """

    table: pd.DataFrame
    schema: linkage.LinkageSchema
    fingerprint: str
    sessions: dict[str, LinkageSession] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def records(self) -> int:
        """The number of records the site encodes: every patient of its frame."""
        return len(self.table)

    @property
    def token_keys(self) -> int:
        """Blocking tokens per record under the site's schema (0 without key blocking)."""
        blocking = self.schema.blocking
        return len(blocking.keys) if blocking.method == "keys" else 0


def site_identifiers(
    site: str,
    frame: pd.DataFrame,
    identifiers: pd.DataFrame | None,
    schema: linkage.LinkageSchema | Mapping[str, Any] | None,
) -> SiteIdentifiers | None:
    """The site's linkage inputs, checked, or ``None`` when it has neither.

    Parameters
    ----------
    site
        The site's name (for error messages).
    frame
        The site's analysis frame: the identifier table must hold exactly its patients.
    identifiers
        The identifier table (index: the frame's patient ids).
    schema
        The ``[linkage]`` table of the site's study specification (``StudySpec.linkage``),
        or its parsed :class:`linkage.LinkageSchema`.

    Raises
    ------
    StudyConfigurationError
        One is given without the other, the table does not hold the frame's patients once
        each, or a column is not in the normal form the schema encodes (naming the column
        and the row).
    """
    if identifiers is None and schema is None:
        return None
    if identifiers is None or schema is None:
        raise StudyConfigurationError(
            f"site {site!r}: a site that links needs both its identifier table and the "
            "[linkage] table of its study specification (identifiers= and linkage=)"
        )
    try:
        schema = linkage_schema(schema)
    except linkage.LinkageSchemaError as error:
        raise StudyConfigurationError(f"site {site!r}: {error}") from None
    if not isinstance(identifiers, pd.DataFrame):
        raise StudyConfigurationError(
            f"site {site!r}: the identifier table must be a pandas DataFrame, got "
            f"{type(identifiers).__name__}"
        )
    index = identifiers.index
    if (
        index.has_duplicates
        or frame.index.has_duplicates
        or not index.sort_values().equals(frame.index.sort_values())
    ):
        raise StudyConfigurationError(
            f"site {site!r}: the identifier table must hold one row for each patient of the "
            "analysis frame, indexed as the frame (harmonize's Harmonized.identifiers)"
        )
    try:
        linkage.check_identifiers(identifiers, schema)
    except linkage.IdentifierError as error:
        raise StudyConfigurationError(f"site {site!r}: {error}") from None
    table = identifiers.loc[frame.index]
    return SiteIdentifiers(table=table, schema=schema, fingerprint=schema.fingerprint())
