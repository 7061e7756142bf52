"""Privacy-preserving record linkage: a site's identifiers become keyed Bloom-filter encodings.

The layers of one linkage, bottom to top:

- :mod:`linkage.schema` reads the study spec's ``[linkage]`` table into a frozen
  :class:`~linkage.schema.LinkageSchema` (with hardened defaults) and writes it as a
  clkhash linkage schema (v3) with a fingerprint both parties compare;
- :mod:`linkage.encoding` encodes a site's identifier table with clkhash under a secret
  the sites share and the linkage unit never holds (Schnell, Bachteler and Reiher 2011,
  "A novel error-tolerant anonymous linking code");
- :mod:`linkage.matching` is the linkage unit's work on two parties' encodings: anonlink's
  Dice-coefficient candidate pairs above the threshold within blocks, then a one-to-one
  solve; each party receives only its own record positions and the linked pair ids;
- :mod:`linkage.quality` measures a linkage: precision, recall and F1 against known
  truth, the match-score histogram otherwise (counts below k suppressed).

This package imports no other project package.
"""

from linkage.encoding import Encodings, check_identifiers, encode
from linkage.errors import (
    EncodingMismatch,
    IdentifierError,
    LinkageError,
    LinkageSchemaError,
    SecretError,
)
from linkage.matching import Linkage, PartyLinks, link
from linkage.schema import LinkageSchema, parse_linkage_table

__all__ = [
    "EncodingMismatch",
    "Encodings",
    "IdentifierError",
    "Linkage",
    "LinkageError",
    "LinkageSchema",
    "LinkageSchemaError",
    "PartyLinks",
    "SecretError",
    "check_identifiers",
    "encode",
    "link",
    "parse_linkage_table",
]
