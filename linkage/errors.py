"""Domain errors of :mod:`linkage`, each naming the field, column or row and what to do."""

from __future__ import annotations


class LinkageError(Exception):
    """Base class of every error this package raises on purpose."""


class LinkageSchemaError(LinkageError):
    """The study spec's ``[linkage]`` table is invalid; ``field`` is the offending key path."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"[linkage] {field}: {problem}")
        self.field = field
        self.problem = problem


class IdentifierError(LinkageError):
    """The identifier table does not have the columns or normal forms the schema encodes.

    ``column`` names the column; ``row`` the index label of the first bad row (or None).
    """

    def __init__(self, column: str, problem: str, row: object = None) -> None:
        where = f"column {column!r}" + ("" if row is None else f", row {row!r}")
        super().__init__(f"identifier table, {where}: {problem}")
        self.column = column
        self.row = row


class SecretError(LinkageError):
    """The linkage secret is missing, of the wrong type or too short."""


class EncodingMismatch(LinkageError):
    """Two parties' encodings were not made under the same schema and cannot be matched."""
