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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from linkage.errors import (
    EncodingMismatch,
    IdentifierError,
    LinkageError,
    LinkageSchemaError,
    SecretError,
)
from linkage.schema import LinkageSchema, parse_linkage_table

if TYPE_CHECKING:
    from linkage.encoding import Encodings, check_identifiers, encode
    from linkage.matching import Linkage, PartyLinks, link

_LAZY = {
    "Encodings": "linkage.encoding",
    "check_identifiers": "linkage.encoding",
    "encode": "linkage.encoding",
    "Linkage": "linkage.matching",
    "PartyLinks": "linkage.matching",
    "link": "linkage.matching",
}
"""Names whose modules import clkhash or anonlink (the ``linkage`` extra): imported when
first used, so the schema (which every site and the coordinator check) needs neither."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'linkage' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"linkage.{name} needs {error.name}, of the 'linkage' extra: "
            "pip install 'fedstats[linkage]' and pip install --no-deps clkhash==0.18.3",
            name=error.name,
        ) from error
    globals()[name] = value
    return value


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
