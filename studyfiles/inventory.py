"""The message inventory: what crossed the silo boundary, request by request.

An inventory is saved as JSON Lines (:meth:`MessageInventory.save`): one
object per message with the fields of :class:`MessageRecord`, ``sent_at`` in
ISO 8601. :meth:`MessageInventory.load` reads it back and names the file,
line and field of anything it cannot read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from studyfiles.errors import InventoryFileError

STATUSES = ("ok", "refused", "error", "unreachable")
"""What became of a request: answered, refused by disclosure control or budget, failed, or lost."""


@dataclass(frozen=True)
class MessageRecord:
    """One request to one site and its reply."""

    seq: int
    task: str
    site: str
    request_bytes: int
    reply_bytes: int
    sent_at: datetime
    seconds: float
    status: str  # "ok", "refused", "error" or "unreachable"
    analysis: str  # the fit or query this message served
    reason: str = ""
    """Why a site refused or failed the request (a disclosure rule such as ``cells``,
    ``protocol``, ``resources``, ``formula``, or the error's type); empty when answered."""
    path: str = ""
    """For an answer at a point of an iterative fit's path: ``"verified"`` when the site
    re-derived the point before answering, ``"signed"`` when it only signed its reply;
    empty otherwise (or for records written before paths)."""


class MessageInventory:
    """Append-only record of every message a federation exchanged
    (:class:`~fedstats.models.federation.Federation`)."""

    def __init__(self) -> None:
        self._records: list[MessageRecord] = []

    def append(self, record: MessageRecord) -> None:
        self._records.append(record)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[MessageRecord]:
        return iter(self._records)

    def records(self, analysis: str | None = None) -> list[MessageRecord]:
        """All records, or those of one analysis."""
        return [r for r in self._records if analysis is None or r.analysis == analysis]

    def to_frame(self, analysis: str | None = None) -> pd.DataFrame:
        """One row per message, in the order sent."""
        columns = list(MessageRecord.__dataclass_fields__)
        return pd.DataFrame([asdict(r) for r in self.records(analysis)], columns=columns)

    def save(self, path: str | PathLike[str]) -> Path:
        """Write every record as one JSON object per line (JSON Lines); returns the path."""
        path = Path(path)
        lines = [
            json.dumps({**asdict(r), "sent_at": r.sent_at.isoformat()}, sort_keys=True)
            for r in self._records
        ]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | PathLike[str]) -> MessageInventory:
        """Read an inventory written by :meth:`save`.

        Raises
        ------
        InventoryFileError
            For a missing or unreadable file, or a line that is not a message
            record (the message names the file, the line and the field).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InventoryFileError(f"cannot read the message inventory {path}: {error}") from None
        inventory = cls()
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                inventory.append(_record_from_line(line, f"{path}, line {number}"))
        return inventory

    def bytes_by_site(self, analysis: str | None = None) -> pd.DataFrame:
        """Messages and bytes each way, per site."""
        frame = self.to_frame(analysis)
        grouped = frame.groupby("site", sort=True)
        return pd.DataFrame(
            {
                "messages": grouped.size(),
                "request_bytes": grouped["request_bytes"].sum(),
                "reply_bytes": grouped["reply_bytes"].sum(),
            }
        )


PATHS = ("", "signed", "verified")
"""The values of :attr:`MessageRecord.path`."""
OPTIONAL_FIELDS = frozenset({"reason", "path"})
"""Fields an older inventory may lack (each read as empty)."""


def _record_from_line(line: str, where: str) -> MessageRecord:
    """One :class:`MessageRecord` from a JSON line, every field checked."""
    try:
        raw = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as error:
        raise InventoryFileError(f"{where}: not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise InventoryFileError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    expected = {f.name for f in fields(MessageRecord)}
    if set(raw) | OPTIONAL_FIELDS != expected:
        missing, extra = sorted(expected - set(raw)), sorted(set(raw) - expected)
        raise InventoryFileError(
            f"{where}: a message record has the fields {sorted(expected)}; "
            f"missing {missing}, unexpected {extra}"
        )
    values: dict[str, Any] = {}
    for name in ("task", "site", "status", "analysis"):
        if not isinstance(raw[name], str):
            raise InventoryFileError(f"{where}: field {name!r} must be a string")
        values[name] = raw[name]
    reason = raw.get("reason", "")  # inventories written before refusals had reasons
    if not isinstance(reason, str):
        raise InventoryFileError(f"{where}: field 'reason' must be a string")
    values["reason"] = reason
    path = raw.get("path", "")  # inventories written before paths
    if path not in PATHS:
        raise InventoryFileError(f"{where}: field 'path' must be one of {list(PATHS)}")
    values["path"] = path
    if values["status"] not in STATUSES:
        raise InventoryFileError(f"{where}: field 'status' must be one of {list(STATUSES)}")
    for name in ("seq", "request_bytes", "reply_bytes"):
        value = raw[name]
        if type(value) is not int or value < 0:
            raise InventoryFileError(f"{where}: field {name!r} must be a non-negative integer")
        values[name] = value
    seconds = raw["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InventoryFileError(f"{where}: field 'seconds' must be a number")
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InventoryFileError(f"{where}: field 'seconds' must be finite and non-negative")
    values["seconds"] = float(seconds)
    try:
        values["sent_at"] = datetime.fromisoformat(raw["sent_at"])
    except (TypeError, ValueError):
        raise InventoryFileError(f"{where}: field 'sent_at' must be an ISO 8601 time") from None
    return MessageRecord(**values)
