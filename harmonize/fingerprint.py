"""Site fingerprints: the schema of an analysis frame, without its data.

A fingerprint lists each column's name, kind, declared categorical levels
(the categories of a pandas ``Categorical``, as the study specification
declares them, never the values observed) and UCUM unit, with a SHA-256
digest of that list. Two sites with equal digests have frames a model can
combine; :meth:`SiteFingerprint.differences` says why two do not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

KINDS = ("boolean", "numeric", "categorical", "datetime", "text")
FINGERPRINT_ATTR = "fingerprint"
"""Where a harmonised frame carries its fingerprint record: ``frame.attrs[FINGERPRINT_ATTR]``."""


@dataclass(frozen=True)
class ColumnFingerprint:
    name: str
    kind: str
    levels: tuple[str, ...] | None = None
    unit: str | None = None

    def as_record(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "levels": list(self.levels) if self.levels is not None else None,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class SiteFingerprint:
    columns: tuple[ColumnFingerprint, ...]
    spec_digest: str = ""
    """Digest of the study specification the frame was harmonised under ("" if none)."""

    def as_record(self) -> dict:
        return {"spec_digest": self.spec_digest, "columns": [c.as_record() for c in self.columns]}

    @classmethod
    def from_record(cls, record: Mapping) -> SiteFingerprint:
        """Rebuild a fingerprint from :meth:`as_record` output (e.g. a report's JSON)."""
        columns = tuple(
            ColumnFingerprint(
                str(c["name"]),
                str(c["kind"]),
                tuple(c["levels"]) if c.get("levels") is not None else None,
                c.get("unit"),
            )
            for c in record["columns"]
        )
        return cls(columns, str(record.get("spec_digest", "")))

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.as_record(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def differences(self, other: SiteFingerprint) -> list[str]:
        """Human-readable reasons why two frames cannot be combined (empty when equal)."""
        mine = {c.name: c for c in self.columns}
        theirs = {c.name: c for c in other.columns}
        out = []
        if self.spec_digest != other.spec_digest:
            out.append(
                f"study specification {self.spec_digest[:12]!r} vs {other.spec_digest[:12]!r}"
            )
        out += [f"column {n!r} only in the first frame" for n in mine if n not in theirs]
        out += [f"column {n!r} only in the second frame" for n in theirs if n not in mine]
        for name in mine.keys() & theirs.keys():
            a, b = mine[name], theirs[name]
            for attribute in ("kind", "levels", "unit"):
                if getattr(a, attribute) != getattr(b, attribute):
                    out.append(
                        f"column {name!r}: {attribute} {getattr(a, attribute)!r} "
                        f"vs {getattr(b, attribute)!r}"
                    )
        return sorted(out)


def fingerprint_frame(
    frame: pd.DataFrame, units: Mapping[str, str] | None = None, spec_digest: str = ""
) -> SiteFingerprint:
    """The fingerprint of an analysis frame; ``units`` maps columns to UCUM units."""
    units = dict(units or {})
    unknown = sorted(set(units) - set(map(str, frame.columns)))
    if unknown:
        raise ValueError(f"units given for columns not in the frame: {unknown}")
    columns = []
    for name in frame.columns:
        series = frame[name]
        kind = _kind(series)
        levels = None
        if isinstance(series.dtype, pd.CategoricalDtype):
            levels = tuple(str(c) for c in series.cat.categories)
        columns.append(ColumnFingerprint(str(name), kind, levels, units.get(str(name))))
    return SiteFingerprint(tuple(sorted(columns, key=lambda c: c.name)), spec_digest)


def frame_data_digest(frame: pd.DataFrame) -> str:
    """SHA-256 of a frame's rows: its CSV text (a header of the columns in order, one line per
    row, numbers at full precision ``%.17g``, missing values empty), as UTF-8.

    The same frame gives the same digest wherever it is computed; a changed, added or
    removed value changes it. It identifies the data a site analysed (the site's own report,
    for its audit), where the schema fingerprint is the same at every site of a study.
    """
    text = frame.to_csv(index=False, lineterminator="\n", float_format="%.17g", na_rep="")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _kind(series: pd.Series) -> str:
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if isinstance(dtype, pd.CategoricalDtype):
        return "categorical"
    if pd.api.types.is_numeric_dtype(dtype):
        return "numeric"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "datetime"
    return "text"
