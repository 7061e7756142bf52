"""The message inventory: what crossed the silo boundary, request by request."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime

import pandas as pd


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


class MessageInventory:
    """Append-only record of every message a :class:`~fedstats.federation.Federation` exchanged."""

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
