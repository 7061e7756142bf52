"""The differencing guard: no two answered row sets may differ on 1 to k - 1 rows.

Two exact answers whose populations differ by one patient give that patient's
contribution by subtraction, though each covers many patients (Duncan &
Pearson, "Enhancing access to microdata while protecting confidentiality",
Stat Sci 1991; the "differencing" attack of the SDC handbook, Hundepool et
al. 2012, §4.2). A site therefore remembers, per study, the *row sets* its
exact answers covered — the rows a design kept, the rows each 0/1 design
column or true/false sub-expression marks, each stratum and group — and
refuses a new row set ``S`` when, for some row set ``T`` answered before (in
this request or an earlier one),

    1 <= |S xor T| <= k - 1    or    1 <= n - |S xor T| <= k - 1

(the second form catches a complement: ``S`` against "every row but ``T``").
Row sets are kept as bitsets over the frame's rows, at the site only, in
memory or in a SQLite file in the site's working folder, keyed by a digest of
the frame (a re-harmonised frame starts a new record).

It also remembers the *columns* its exact answers were computed from — every
design column, continuous outcome, offset, follow-up time and weights vector
— and refuses a new column that differs from a remembered one over the same
rows, or from an affine image ``c a + d`` of it, on 1 to k - 1 rows (patients,
when a frame holds several rows per patient): sums over the two differ by
those rows' terms (:mod:`fedstats.site.near_copies`). The columns are kept as
they are (float64), at the site only, beside the row sets: a column of the site's
held frame, which nothing can write (:mod:`fedstats.site.frame_layout`), by
reference; any other as the guard's own read-only copy.

The record fails closed: it holds at most ``max_guard_entries`` row sets and
columns together (a privacy officer's setting, :class:`DisclosurePolicy`).
When a request would need more, it is refused (rule ``guard-full``) and
nothing is forgotten; forgetting the oldest entries would let a coordinator
flood the record and then ask again what it was refused.

The guard also caps how often one analysis (one agreed design, or one
survival outcome) is asked (``max_rounds_per_analysis``) and how many
analyses a study may ask (``max_analyses_per_study``).

This is a heuristic, not a guarantee: it compares row sets, not every
function of them. An approved protocol or differential privacy is the
guarantee (README, "Threat model").
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from fedstats.errors import DisclosureError
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.frame_layout import immutable
from fedstats.site.near_copies import near_copies


def frame_digest(frame: pd.DataFrame) -> str:
    """A digest of a frame's rows, so row positions are only compared within one frame."""
    hashed = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return hashlib.sha256(hashed.tobytes() + str(list(frame.columns)).encode()).hexdigest()[:32]


class DifferencingGuard:
    """Row sets a site answered about, and the rounds per analysis (see the module docstring).

    Parameters
    ----------
    policy:
        The site's disclosure policy (``k_cell`` and the caps).
    frame:
        The site's analysis frame (its size and digest; rows stay where they are).
    path:
        A SQLite file that keeps the record between runs; in memory when ``None``.
    """

    def __init__(
        self, policy: DisclosurePolicy, frame: pd.DataFrame, *, path: Path | None = None
    ) -> None:
        key = frame_digest(frame) if path is not None else "memory"
        self._open(policy, len(frame), key, path)

    def companion(self, unit: str, n: int) -> DifferencingGuard:
        """A guard over ``n`` other units of the same frame (e.g. its patients, when a frame
        holds several rows per patient), kept in the same record as this one: it survives
        a restart exactly when this guard does."""
        guard = DifferencingGuard.__new__(DifferencingGuard)
        guard._open(self.policy, n, f"{self._frame}:{unit}:{n}", self._path)
        self._companions.append(guard)
        return guard

    def _open(self, policy: DisclosurePolicy, n: int, key: str, path: Path | None) -> None:
        self.policy = policy
        self.n = n
        self._frame = key
        self._path = path
        self._companions: list[DifferencingGuard] = []
        self._lock = threading.Lock()
        self._sets: list[np.ndarray] = []
        self._labels: list[str] = []
        self._rounds: dict[str, int] = {}
        self._grids: dict[str, np.ndarray] = {}
        self._columns: dict[str, str] = {}
        self._matrix: np.ndarray | None = None
        self._answered: dict[str, list[np.ndarray]] = {}
        self._ranges: dict[str, list[tuple[float, float]]] = {}  # each column's least, greatest
        self._db: sqlite3.Connection | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS row_sets "
                "(frame TEXT, label TEXT, bits BLOB, PRIMARY KEY (frame, bits))"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS rounds "
                "(frame TEXT, analysis TEXT, count INTEGER, PRIMARY KEY (frame, analysis))"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS grids "
                "(frame TEXT, outcome TEXT, grid BLOB, PRIMARY KEY (frame, outcome))"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS columns "
                "(frame TEXT, role TEXT, name TEXT, PRIMARY KEY (frame, role))"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS answered_columns (frame TEXT, rows TEXT, "
                "label TEXT, column BLOB, PRIMARY KEY (frame, rows, column))"
            )
            for rows, column in self._db.execute(
                "SELECT rows, column FROM answered_columns WHERE frame = ? ORDER BY rowid",
                (self._frame,),
            ):
                values = np.frombuffer(column, np.float64)  # read-only: kept as it is
                self._remember(rows, values, float(values.min()), float(values.max()))
            self._columns = dict(
                self._db.execute(
                    "SELECT role, name FROM columns WHERE frame = ?", (self._frame,)
                ).fetchall()
            )
            for label, bits in self._db.execute(
                "SELECT label, bits FROM row_sets WHERE frame = ? ORDER BY rowid", (self._frame,)
            ):
                self._sets.append(np.frombuffer(bits, dtype=np.uint8))
                self._labels.append(label)
            self._grids = {
                outcome: np.frombuffer(grid, dtype=np.float64)
                for outcome, grid in self._db.execute(
                    "SELECT outcome, grid FROM grids WHERE frame = ?", (self._frame,)
                )
            }
            self._rounds = dict(
                self._db.execute(
                    "SELECT analysis, count FROM rounds WHERE frame = ?", (self._frame,)
                ).fetchall()
            )

    # ------------------------------------------------------------ row sets and columns

    def check_row_sets(
        self, site: str, task: str | None, sets: Iterable[tuple[str, np.ndarray]]
    ) -> None:
        """:meth:`check_release` of row sets alone."""
        self.check_release(site, task, sets)

    def check_release(
        self,
        site: str,
        task: str | None,
        sets: Iterable[tuple[str, np.ndarray]],
        columns: Iterable[tuple[str, np.ndarray]] = (),
        *,
        rows: np.ndarray | None = None,
        units: np.ndarray | None = None,
    ) -> None:
        """Refuse a row set or column near one answered before or another of this request;
        then keep the new ones (nothing is kept when one is refused).

        Parameters
        ----------
        sets:
            ``(label, mask)`` pairs, each mask a boolean array over the frame's rows.
        columns:
            ``(label, values)`` pairs: the columns the exact answer is computed from, each
            over the frame rows ``rows`` (in that order; ``None``: every frame row).
        units:
            The patient of each of those rows, when a frame holds several rows per patient
            (near-copies are then counted in patients).

        Raises :class:`~fedstats.errors.DisclosureError`: rule ``guard-full`` when the new
        entries would take the record past ``policy.max_guard_entries``, rule
        ``differencing`` when an entry is near a remembered one.
        """
        k = self.policy.k_cell
        if k <= 1:
            return
        packed = []
        for label, mask in sets:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (self.n,):
                raise ValueError(f"row set {label!r} must be a mask over the {self.n} frame rows")
            packed.append((label, np.packbits(mask)))
        group = self._rows_key(rows)
        width = self.n if rows is None else len(rows)
        values = []
        for label, column in columns:
            column = np.ascontiguousarray(column, dtype=np.float64)
            if column.shape != (width,) or not np.isfinite(column).all():
                raise ValueError(f"column {label!r} must hold {width} finite values")
            values.append((label, column))
        with self._lock:
            near: str | None = None
            fresh_sets: list[tuple[str, np.ndarray]] = []
            for label, bits in packed:
                differ = np.concatenate(
                    [self._differences(bits), [_differ(bits, other) for _, other in fresh_sets]]
                ).astype(np.int64)
                if (
                    near is None
                    and (
                        ((differ > 0) & (differ < k))
                        | ((self.n - differ > 0) & (self.n - differ < k))
                    ).any()
                ):
                    near = (
                        f"the rows of {label!r} differ from rows this site has already answered "
                        f"about on fewer than {k} rows (differencing guard)"
                    )
                if not (differ == 0).any():
                    fresh_sets.append((label, bits))
            fresh_columns: list[tuple[str, np.ndarray, float, float]] = []
            kept = self._answered.get(group, [])
            ranges = np.array(self._ranges.get(group, []), dtype=np.float64).reshape(-1, 2)
            low = np.concatenate([ranges[:, 0], np.empty(len(values))])  # each one's least,
            high = np.concatenate([ranges[:, 1], np.empty(len(values))])  # and greatest
            for label, column in values:
                compared = len(kept) + len(fresh_columns)
                close, same = near_copies(
                    (*kept, *(fresh for _, fresh, _, _ in fresh_columns)),
                    column,
                    k,
                    units,
                    extremes=(low[:compared], high[:compared]),
                )
                if near is None and close.any():
                    unit = "rows" if units is None else "patients"
                    near = (
                        f"the values of {label!r} differ from a column this site has already "
                        "answered about (or from a multiple of it plus a constant) by amounts "
                        f"held mostly by fewer than {k} {unit}, so two answers would give "
                        f"those {unit}' values by subtraction (differencing guard)"
                    )
                if not same.any():
                    low[compared], high[compared] = column.min(), column.max()
                    fresh_columns.append((label, column, low[compared], high[compared]))
            fresh = len(fresh_sets) + len(fresh_columns)
            cap = self.policy.max_guard_entries
            if fresh and self.entries + fresh > cap:
                raise DisclosureError(
                    site=site,
                    task=task,
                    reason=(
                        f"the differencing guard's record is full: it remembers {self.entries} "
                        f"row sets and columns, and this request needs {fresh} more, past the "
                        f"site's cap of {cap} (max_guard_entries). Nothing is forgotten, so "
                        "requests that repeat answered designs are still served; the site's "
                        "privacy officer can raise max_guard_entries in site.toml [disclosure]"
                    ),
                    rule="guard-full",
                )
            if near is not None:
                raise DisclosureError(
                    site=site,
                    task=task,
                    reason=near,
                    rule="differencing",
                )
            self._keep(fresh_sets)
            self._keep_columns(group, fresh_columns)

    @property
    def entries(self) -> int:
        """Row sets and columns remembered (the count ``max_guard_entries`` caps)."""
        return len(self._sets) + sum(len(group) for group in self._answered.values())

    @staticmethod
    def _rows_key(rows: np.ndarray | None) -> str:
        """Columns are compared over the same frame rows only: a column over other rows
        differs on the rows in one but not the other, which the design's row set meets."""
        if rows is None:
            return "all"
        positions = np.ascontiguousarray(rows, dtype=np.int64)
        return hashlib.sha256(positions.tobytes()).hexdigest()[:32]

    def _differences(self, bits: np.ndarray) -> np.ndarray:
        """``|S xor T|`` for every kept row set ``T``."""
        if self._matrix is None or len(self._matrix) != len(self._sets):
            self._matrix = np.stack(self._sets) if self._sets else None
        if self._matrix is None:
            return np.zeros(0, dtype=np.int64)
        return np.bitwise_count(np.bitwise_xor(self._matrix, bits)).sum(axis=1)

    def _keep(self, fresh: list[tuple[str, np.ndarray]]) -> None:
        if fresh:
            self._matrix = None
        for label, bits in fresh:
            self._sets.append(bits)
            self._labels.append(label)
            if self._db is not None:
                self._db.execute(
                    "INSERT OR IGNORE INTO row_sets VALUES (?, ?, ?)",
                    (self._frame, label[:200], bits.tobytes()),
                )

    def _keep_columns(self, group: str, fresh: list[tuple[str, np.ndarray, float, float]]) -> None:
        """Remember ``fresh`` columns (with their least and greatest values): by reference
        when nothing can change them (a column of the site's held frame,
        :func:`fedstats.site.frame_layout.immutable`), else as the guard's own copy, never a
        design's array."""
        for label, column, least, greatest in fresh:
            kept = column if immutable(column) else column.copy()
            kept.flags.writeable = False
            self._remember(group, kept, float(least), float(greatest))
            if self._db is not None:
                self._db.execute(
                    "INSERT OR IGNORE INTO answered_columns VALUES (?, ?, ?, ?)",
                    (self._frame, group, label[:200], kept.tobytes()),
                )

    def _remember(self, group: str, column: np.ndarray, least: float, greatest: float) -> None:
        self._answered.setdefault(group, []).append(column)
        self._ranges.setdefault(group, []).append((least, greatest))

    # ------------------------------------------------------------ rounds

    def count_round(
        self, site: str, task: str | None, analysis: str, *, limit: int | None = None
    ) -> None:
        """Count one exact request of ``analysis``; refuse beyond the policy's caps
        (or ``limit``, an approved protocol's rounds for the analysis)."""
        with self._lock:
            count = self._rounds.get(analysis, 0)
            if count == 0 and len(self._rounds) >= self.policy.max_analyses_per_study:
                raise DisclosureError(
                    site=site,
                    task=task,
                    reason=(
                        f"the study has asked this site for {len(self._rounds)} analyses, the "
                        "most the site allows; the site's privacy officer can raise "
                        "max_analyses_per_study"
                    ),
                    rule="rounds",
                )
            cap = self.policy.max_rounds_per_analysis if limit is None else limit
            if count >= cap:
                raise DisclosureError(
                    site=site,
                    task=task,
                    reason=(
                        f"this analysis has had {count} rounds, the most the site allows "
                        f"({'max_rounds_per_analysis' if limit is None else 'the protocol'})"
                    ),
                    rule="rounds",
                )
            self._rounds[analysis] = count + 1
            if self._db is not None:
                self._db.execute(
                    "INSERT INTO rounds VALUES (?, ?, 1) ON CONFLICT (frame, analysis) "
                    "DO UPDATE SET count = count + 1",
                    (self._frame, analysis),
                )

    # ------------------------------------------------------------ study grids

    def study_grid(self, outcome: str, grid: np.ndarray) -> np.ndarray:
        """The time grid pinned for ``outcome``; the first grid asked for is pinned
        (see :mod:`fedstats.site.survival_grid`)."""
        with self._lock:
            if outcome not in self._grids:
                pinned = np.array(grid, dtype=np.float64)
                self._grids[outcome] = pinned
                if self._db is not None:
                    self._db.execute(
                        "INSERT OR IGNORE INTO grids VALUES (?, ?, ?)",
                        (self._frame, outcome, pinned.tobytes()),
                    )
            return self._grids[outcome]

    def study_column(self, role: str, name: str) -> str:
        """The column pinned for ``role`` (e.g. the entry times of one survival outcome); the
        first column asked for is pinned, across restarts as the row sets are."""
        with self._lock:
            if role not in self._columns:
                self._columns[role] = name
                if self._db is not None:
                    self._db.execute(
                        "INSERT OR IGNORE INTO columns VALUES (?, ?, ?)", (self._frame, role, name)
                    )
            return self._columns[role]

    @property
    def row_sets(self) -> int:
        """How many distinct row sets the site has answered about."""
        return len(self._sets)

    def close(self) -> None:
        for companion in self._companions:
            companion.close()
        if self._db is not None:
            self._db.close()
            self._db = None


def _differ(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.bitwise_count(np.bitwise_xor(a, b)).sum())


def mode_mask(values: np.ndarray) -> np.ndarray:
    """Rows where a column differs from its most common value."""
    uniques, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return inverse.reshape(-1) != int(np.argmax(counts)) if uniques.size else np.zeros(0, bool)
