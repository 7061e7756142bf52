"""The Cox partial likelihood of one site's strata: log-likelihood, score and information.

For a stratum with distinct event times ``t_1 < ... < t_m``, risk sets
``R_j = {i : T_i >= t_j}``, tied events ``D_j = {i : T_i = t_j, delta_i = 1}``
of size ``d_j`` and weights ``w_i = exp(x_i' beta)``, write
``S0_j, S1_j, S2_j`` for the sums of ``w_i, w_i x_i, w_i x_i x_i'`` over
``R_j`` and ``E0_j, E1_j, E2_j`` for the same sums over ``D_j``.

* **Breslow** (Breslow, 1974):
  ``l = sum_j [ sum_{D_j} x_i' beta - d_j log S0_j ]``,
  score ``sum_j [ sum_{D_j} x_i - d_j S1_j / S0_j ]``, information
  ``sum_j d_j [ S2_j / S0_j - a_j a_j' ]`` with ``a_j = S1_j / S0_j``.
* **Efron** (Efron, JASA 1977): the ``d_j`` tied events leave the risk set
  in equal fractions ``f_l = l / d_j``, ``l = 0..d_j-1``:
  ``l = sum_j [ sum_{D_j} x_i' beta - sum_l log(S0_j - f_l E0_j) ]``; the
  score and information replace ``S_k / S0`` by
  ``(S_k - f_l E_k) / (S0 - f_l E0)`` summed over ``l``.

The information is assembled as ``X' diag(c) X - A' A`` in ``O(n p^2)``
operations, never as one ``p x p`` matrix per event time: a patient's
coefficient ``c_i`` collects ``w_i / (S0_j - f_l E0_j)`` over the event times
whose risk set holds them, less ``w_i f_l / (S0_j - f_l E0_j)`` at their own
tied event time; the rows of ``A`` are the ``a_{jl}``. Strata add up: the
partial likelihood of a stratified model is the sum over strata (Kalbfleisch
& Prentice, 2002, section 4.4), so a site returns the sums over its strata
and the coordinator sums over sites. Linear predictors are shifted by their
maximum within each stratum, which leaves every ratio and the log-likelihood
unchanged and keeps ``exp`` finite.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.schema import Array

TIES = ("breslow", "efron")


@dataclass(frozen=True)
class PartialLikelihood:
    """``loglik``, ``score`` (p) and ``information`` (p x p, the negative Hessian)."""

    loglik: float
    score: np.ndarray
    information: np.ndarray


@dataclass(frozen=True)
class SortedSurvival:
    """One site's rows sorted by stratum, then time, with the positions of event times.

    Built once per design; every Newton round reuses it. For
    ``Surv(start, stop, event)`` (``entry`` given) a row is at risk at ``t``
    when ``start < t <= stop``: the risk set at an event time is the rows whose
    stop is not before it (a suffix of the sorted rows) less those whose start
    is not before it (a suffix of the rows sorted by start). Frequency weights
    ``v`` (``case_weights``) make every row count ``v`` times.
    """

    X: np.ndarray  # n x p, sorted
    time: np.ndarray
    event: np.ndarray  # bool
    stratum: np.ndarray  # int codes, sorted
    risk_start: np.ndarray  # per event time: first sorted row of its risk set (its time)
    tie_events: np.ndarray  # per event time: d_j
    event_group: np.ndarray  # per event row: the index of its event time
    order: np.ndarray  # sorted row r is the design's row order[r]
    case_weights: np.ndarray | None = None  # per sorted row; None: every row counts once
    late: Entries | None = None  # delayed entries (Surv(start, stop, event)); None: none

    @property
    def tie_weights(self) -> np.ndarray:
        """Per event time: the summed frequency weights of its events (``d_j`` unweighted)."""
        if self.case_weights is None:
            return self.tie_events.astype(np.float64)
        rows = np.flatnonzero(self.event)
        return np.bincount(
            self.event_group, weights=self.case_weights[rows], minlength=len(self.tie_events)
        )


@dataclass(frozen=True)
class Entries:
    """Where delayed entries leave each event time's risk set, for ``Surv(start, stop, event)``.

    ``by_start`` lists the sorted rows in (stratum, start) order; the rows of an
    event time's stratum whose start is not before it are
    ``by_start[first[j]:last[j]]``. ``passed[i]`` is one past the last event
    time of row ``i``'s stratum at or before its start (``stratum_first[i]`` its
    stratum's first): the event times whose risk sets row ``i`` has not yet
    joined are ``stratum_first[i]:passed[i]``.
    """

    by_start: np.ndarray
    first: np.ndarray
    last: np.ndarray
    passed: np.ndarray
    stratum_first: np.ndarray

    def suffix(self, values: np.ndarray) -> np.ndarray:
        """Per event time: the sum of ``values`` (per sorted row) over the rows not yet entered."""
        total = np.zeros((len(values) + 1, *values.shape[1:]))
        total[:-1] = np.cumsum(values[self.by_start][::-1], axis=0)[::-1]
        return total[self.first] - total[self.last]

    def before(self, per_event_time: np.ndarray) -> np.ndarray:
        """Per sorted row: the sum of ``per_event_time`` over the event times before its entry."""
        running = np.concatenate(([0.0], np.cumsum(per_event_time)))
        return running[self.passed] - running[self.stratum_first]


def sort_survival(
    X: np.ndarray,
    time: np.ndarray,
    event: np.ndarray,
    stratum: np.ndarray,
    *,
    entry: np.ndarray | None = None,
    case_weights: np.ndarray | None = None,
) -> SortedSurvival:
    """Sort rows by (stratum, time) and index the event times of every stratum.

    ``entry``: the start times of ``Surv(start, stop, event)`` (``time`` holds
    the stops). ``case_weights``: frequency weights ``>= 0``; an event row of
    weight 0 is no event (it changes no count, Efron's ``d_j`` included).
    """
    event = np.asarray(event).astype(bool)
    if case_weights is not None:
        event = event & (case_weights > 0)
    order = np.lexsort((time, stratum))
    X, time, event, stratum = X[order], time[order], event[order], stratum[order]
    n = len(time)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (stratum[1:] != stratum[:-1]) | (time[1:] != time[:-1])
    group_start = np.flatnonzero(new_group)
    group_of_row = np.cumsum(new_group) - 1
    events_per_group = np.bincount(group_of_row, weights=event, minlength=len(group_start))
    event_groups = np.flatnonzero(events_per_group > 0)
    renumber = np.full(len(group_start), -1)
    renumber[event_groups] = np.arange(len(event_groups))
    risk_start = group_start[event_groups]
    return SortedSurvival(
        X=np.ascontiguousarray(X),
        time=time,
        event=event,
        stratum=stratum,
        risk_start=risk_start,
        tie_events=events_per_group[event_groups].astype(np.int64),
        event_group=renumber[group_of_row[event]],
        order=order,
        case_weights=None if case_weights is None else case_weights[order].astype(np.float64),
        late=None if entry is None else _entries(entry[order], time, stratum, risk_start),
    )


def _entries(
    start: np.ndarray, stop: np.ndarray, stratum: np.ndarray, risk_start: np.ndarray
) -> Entries:
    """Index the delayed entries of rows sorted by (stratum, stop) (see :class:`Entries`).

    Times within a stratum are compared through one integer key,
    ``stratum * (m + 1) + rank`` over the ``m`` distinct times, so every search
    is one ``searchsorted`` over all strata.
    """
    times = np.unique(np.concatenate((start, stop)))
    span = len(times) + 1
    key = lambda s, t: s.astype(np.int64) * span + np.searchsorted(times, t)  # noqa: E731
    by_start = np.lexsort((start, stratum))
    start_keys = key(stratum[by_start], start[by_start])
    event_stratum, event_time = stratum[risk_start], stop[risk_start]
    event_keys = key(event_stratum, event_time)
    first = np.searchsorted(start_keys, event_keys, side="left")  # start >= t_j
    last = np.searchsorted(start_keys, key(event_stratum, times[-1]), side="right")
    passed = np.searchsorted(event_keys, key(stratum, start), side="right")  # t_j <= start
    stratum_first = np.searchsorted(event_keys, key(stratum, times[:1].repeat(len(stratum))))
    return Entries(by_start, first, last, passed, stratum_first)


def risk_set_sizes(data: SortedSurvival) -> np.ndarray:
    """Per event time: how many rows (of positive weight) its risk set holds."""
    counted = (
        np.ones(len(data.time)) if data.case_weights is None else (data.case_weights > 0) * 1.0
    )
    sizes = _reverse_cumsum_by_stratum(counted, data.stratum)[data.risk_start]
    if data.late is not None:
        sizes = sizes - data.late.suffix(counted)
    return np.round(sizes).astype(np.int64)


def partial_likelihood(data: SortedSurvival, beta: np.ndarray, ties: str) -> PartialLikelihood:
    """Log partial likelihood, score and information at ``beta`` (see the module docstring)."""
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    X, stratum = data.X, data.stratum
    n, p = X.shape
    if len(data.tie_events) == 0:
        return PartialLikelihood(0.0, np.zeros(p), np.zeros((p, p)))
    eta = X @ beta
    eta = eta - _stratum_max(eta, stratum)
    v = np.ones(n) if data.case_weights is None else data.case_weights
    w = v * np.exp(eta)
    # Sums over {rows at or after r within r's stratum}: reverse cumulative sums, restarted
    # at each stratum's end; less the rows not yet entered (Surv(start, stop, event)).
    S0_rows = _reverse_cumsum_by_stratum(w, stratum)
    S1_rows = _reverse_cumsum_by_stratum(w[:, None] * X, stratum)
    S0 = S0_rows[data.risk_start]
    S1 = S1_rows[data.risk_start]
    if data.late is not None:
        S0 = S0 - data.late.suffix(w)
        S1 = S1 - data.late.suffix(w[:, None] * X)
    d = data.tie_events
    event_rows = np.flatnonzero(data.event)
    group = data.event_group
    E0 = np.bincount(group, weights=w[event_rows], minlength=len(d))
    E1 = np.zeros((len(d), p))
    np.add.at(E1, group, w[event_rows, None] * X[event_rows])
    # One (event time, l) pair per event: f_l = l / d_j for Efron, 0 for Breslow. Each pair
    # counts the mean weight of its tied events (R's coxph and lifelines with case weights).
    pair_group = np.repeat(np.arange(len(d)), d)
    if ties == "efron":
        within = np.arange(len(pair_group)) - np.repeat(np.cumsum(d) - d, d)
        fraction = within / d[pair_group]
    else:
        fraction = np.zeros(len(pair_group))
    mean_weight = (data.tie_weights / d)[pair_group]
    denominator = S0[pair_group] - fraction * E0[pair_group]
    numerator = S1[pair_group] - fraction[:, None] * E1[pair_group]
    a = numerator / denominator[:, None]
    loglik = float(v[event_rows] @ eta[event_rows] - mean_weight @ np.log(denominator))
    score = v[event_rows] @ X[event_rows] - mean_weight @ a
    # c_i: sum of m/den over the pairs whose risk set holds row i (risk sets are suffixes
    # of the stratum, so a cumulative sum over event times, in time order, per stratum,
    # less the event times before the row's entry).
    inverse = np.bincount(pair_group, weights=mean_weight / denominator, minlength=len(d))
    own_fraction = np.bincount(
        pair_group, weights=mean_weight * fraction / denominator, minlength=len(d)
    )
    at_time = np.zeros(n)
    np.add.at(at_time, data.risk_start, inverse)
    reach = _cumsum_by_stratum(at_time, stratum)
    if data.late is not None:
        reach = reach - data.late.before(inverse)
    c = w * reach
    c[event_rows] -= w[event_rows] * own_fraction[group]
    information = (X * c[:, None]).T @ X - a.T @ (mean_weight[:, None] * a)
    return PartialLikelihood(loglik, score, information)


def _stratum_max(values: np.ndarray, stratum: np.ndarray) -> np.ndarray:
    starts = np.flatnonzero(np.r_[True, stratum[1:] != stratum[:-1]])
    maxima = np.maximum.reduceat(values, starts)
    return np.repeat(maxima, np.diff(np.append(starts, len(values))))


def _cumsum_by_stratum(values: np.ndarray, stratum: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` restarted at every new stratum (rows sorted by stratum)."""
    total = np.cumsum(values, axis=0)
    starts = np.flatnonzero(np.r_[True, stratum[1:] != stratum[:-1]])
    before = np.zeros_like(total[starts])
    before[1:] = total[starts[1:] - 1]
    sizes = np.diff(np.append(starts, len(values)))
    return total - np.repeat(before, sizes, axis=0)


def _reverse_cumsum_by_stratum(values: np.ndarray, stratum: np.ndarray) -> np.ndarray:
    """Sums of ``values`` from each row to the end of its stratum."""
    return _cumsum_by_stratum(values[::-1], stratum[::-1])[::-1]


# ----------------------------------------------------------------------------- time grid
def grid_sums_schema(n_points: int, p: int) -> dict[str, Array]:
    """The reply fields of :class:`GridSums` for ``n_points`` grid points and ``p`` columns."""
    return {
        "d": Array((n_points,)),
        "S0": Array((n_points,)),
        "S1": Array((n_points, p)),
        "S2": Array((n_points, packed_size(p))),
        "E0": Array((n_points,)),
        "E1": Array((n_points, p)),
        "E2": Array((n_points, packed_size(p))),
        "x_events": Array((p,)),
    }


@dataclass(frozen=True)
class GridSums:
    """Risk-set and tied-event sums per grid point (a site's, or their total over sites).

    ``d`` (K) event counts; ``S0`` (K), ``S1`` (K x p), ``S2`` (K x p(p+1)/2) sums of
    ``w, w x, w x x'`` over the risk set ``{t* >= g_j}`` (``{start* < g_j <= stop*}``
    for ``Surv(start, stop, event)``); ``E0, E1, E2`` the same over the events at
    ``g_j``; ``x_events`` (p) the sum of ``x`` over all events. ``x x'`` is symmetric, so
    ``S2`` and ``E2`` hold only its upper triangle, row by row (:func:`packed_size`,
    :func:`unpack_symmetric`), which at ten covariates spares 40 % of a reply's numbers, and
    so of every byte a verified path relays.
    """

    d: np.ndarray
    S0: np.ndarray
    S1: np.ndarray
    S2: np.ndarray
    E0: np.ndarray
    E1: np.ndarray
    E2: np.ndarray
    x_events: np.ndarray

    @property
    def weighted_events(self) -> np.ndarray:
        """The events' summed frequency weights per grid point (``d`` without weights)."""
        return self.d


@dataclass(frozen=True)
class WeightedGridSums(GridSums):
    """:class:`GridSums` with frequency weights ``v``: every sum counts a row ``v`` times
    (``w = v exp(x' beta)``), ``d`` counts the event rows of positive weight (Efron's tied
    events) and ``d_weighted`` (K) their summed weights."""

    d_weighted: np.ndarray

    @property
    def weighted_events(self) -> np.ndarray:
        return self.d_weighted


def risk_scores(X: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``exp(X beta)``; ``ValueError`` when the linear predictor overflows."""
    with np.errstate(over="raise"):
        try:
            return np.exp(np.dot(X, beta))
        except FloatingPointError:
            raise ValueError(
                "the linear predictor overflows exp(); rescale the covariates"
            ) from None


def grid_sums(
    X: np.ndarray,
    coarse: np.ndarray,
    event: np.ndarray,
    beta: np.ndarray,
    n_points: int,
    *,
    entry: np.ndarray | None = None,
    case_weights: np.ndarray | None = None,
) -> WeightedGridSums:
    """One site's :class:`WeightedGridSums` at ``beta`` for rows at grid index ``coarse``
    (:class:`GridRows`, laid out for one point only)."""
    rows = GridRows.of(X, coarse, event, n_points, entry=entry, case_weights=case_weights)
    return rows.sums(beta)


@dataclass(frozen=True)
class GroupedRows:
    """Rows sorted by a group index (``0 .. n_groups - 1``), with their weights ``v``: what
    :meth:`sums` adds up per group at every point of a fit (a site keeps it between rounds),
    and where each group's rows begin, cut into blocks of whole groups."""

    XT: np.ndarray
    """The rows in order of their group, as columns (``p x n``, contiguous: each covariate's
    values side by side)."""
    v: np.ndarray
    groups: np.ndarray
    """The groups that hold rows, in order."""
    firsts: np.ndarray
    """The position of each of those groups' first row."""
    cuts: np.ndarray
    """Indices into ``groups`` where a block begins, and their number at the end: each block
    holds whole groups, at most :data:`_BLOCK_BYTES` of products unless one group is larger."""
    n_groups: int
    adders: tuple[Any, ...]
    """Per block, the 0/1 matrix (``groups x rows``, compressed sparse rows) whose product
    with the block's products sums each group's rows."""

    @property
    def held_bytes(self) -> int:
        """The bytes of its arrays, the group matrices' included (what a site's bounded cache
        counts: :func:`fedstats.site.design_cache.footprint`)."""
        arrays = (self.XT, self.v, self.groups, self.firsts, self.cuts)
        sparse = (part for m in self.adders for part in (m.data, m.indices, m.indptr))
        return sum(array.nbytes for array in (*arrays, *sparse))

    @classmethod
    def of(cls, X: np.ndarray, v: np.ndarray, group: np.ndarray, n_groups: int) -> GroupedRows:
        small = group.astype(np.uint16) if n_groups <= 2**16 else group  # radix-sorted
        order = np.argsort(small, kind="stable")
        group = group[order]
        firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else []
        firsts = np.asarray(firsts, dtype=np.int64)
        p = X.shape[1]
        size = max(256, _BLOCK_BYTES // (8 * (p + packed_size(p))))
        cuts, begin = [0], 0
        for index, row in enumerate(firsts):  # a new block at the first group past the size
            if row - begin >= size:
                cuts.append(index)
                begin = row
        cuts.append(len(firsts))
        cuts = np.unique(cuts)
        return cls(np.ascontiguousarray(X[order].T), v[order], group[firsts], firsts, cuts,
                   n_groups, group_adders(firsts, cuts, len(group)))  # fmt: skip

    def sums(self, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sums of ``w``, ``w x`` and the upper triangle of ``w x x'`` (row by row:
        :func:`pack_symmetric`) over each group's rows, ``w = v exp(x' beta)``.

        A block of whole groups at a time, each block's products ``w x_i x_j`` (``j >= i``)
        written one covariate pair after another into one buffer, row ``i`` of the
        triangle as ``(w x_i) x_{i..p}`` (contiguous writes), and summed over each group's
        rows at once: the block's 0/1 group matrix times its products (:attr:`adders`; a
        sparse product, which releases the interpreter lock, where ``np.add.reduceat`` along
        the rows holds it and calls its loop once per group and product).
        """
        XT, firsts, n_rows = self.XT, self.firsts, self.XT.shape[1]
        w = self.v * risk_scores(XT.T, beta)
        p = XT.shape[0]
        width = p + packed_size(p)
        out = np.empty((len(firsts), width))
        bounds = np.r_[firsts, n_rows]
        rows = np.diff(bounds[self.cuts])
        buffer = np.empty((width, int(rows.max()) if len(rows) else 0))
        for lo, hi, adder in zip(self.cuts[:-1], self.cuts[1:], self.adders, strict=True):
            begin, end = bounds[lo], bounds[hi]
            block, products = XT[:, begin:end], buffer[:, : end - begin]
            np.multiply(block, w[begin:end], out=products[:p])
            row = p
            for i in range(p):
                np.multiply(products[i], block[i:], out=products[row : row + p - i])
                row += p - i
            out[lo:hi] = adder @ products.T
        S0 = np.zeros(self.n_groups)
        S1 = np.zeros((self.n_groups, p))
        S2 = np.zeros((self.n_groups, width - p))
        S0[self.groups] = np.add.reduceat(w, firsts) if len(firsts) else 0.0
        S1[self.groups] = out[:, :p]
        S2[self.groups] = out[:, p:]
        return S0, S1, S2


def group_adders(firsts: np.ndarray, cuts: np.ndarray, n_rows: int) -> tuple[Any, ...]:
    """For each block of :class:`GroupedRows` (groups ``cuts[b]`` to ``cuts[b + 1]``, whose
    rows begin at ``firsts``), the ``groups x rows`` 0/1 matrix with a 1 where a row is in a
    group, as compressed sparse rows (its row pointers are the groups' first rows)."""
    from scipy.sparse import csr_array  # a site's Cox rounds only, not every import

    bounds = np.r_[firsts, n_rows].astype(np.int64)
    adders = []
    for lo, hi in itertools.pairwise(cuts):
        begin, end = int(bounds[lo]), int(bounds[hi])
        rows = end - begin
        pointers = bounds[lo : hi + 1] - begin
        adders.append(csr_array((np.ones(rows), np.arange(rows), pointers), shape=(hi - lo, rows)))
    return tuple(adders)


@dataclass(frozen=True)
class GridRows:
    """One site's rows laid out for :class:`WeightedGridSums` on a grid of ``n_points``:
    sorted once by point and event (:class:`GroupedRows`, group ``2 j + event``), with what
    does not depend on ``beta`` (event counts, the events' covariate sum) summed once, so a
    fit's rounds only weigh and add (:meth:`sums`).

    Built by :meth:`of` from the rows at grid index ``coarse`` (``entry``: for
    ``Surv(start, stop, event)``, each row's coarsened start, -1 from the first point on;
    the row is at risk at the points ``entry < j <= coarse``; ``case_weights``: frequency
    weights ``v``).
    """

    by_point: GroupedRows
    entering: GroupedRows | None
    """The rows with a start, grouped by it (``None`` for ``Surv(time, event)``)."""
    d: np.ndarray
    d_weighted: np.ndarray
    x_events: np.ndarray

    @classmethod
    def of(
        cls,
        X: np.ndarray,
        coarse: np.ndarray,
        event: np.ndarray,
        n_points: int,
        *,
        entry: np.ndarray | None = None,
        case_weights: np.ndarray | None = None,
    ) -> GridRows:
        event = np.asarray(event, dtype=bool)
        v = np.ones(len(coarse)) if case_weights is None else case_weights
        entering = None
        if entry is not None:
            later = entry >= 0
            entering = GroupedRows.of(X[later], v[later], entry[later], n_points)
        return cls(
            GroupedRows.of(X, v, 2 * coarse + event, 2 * n_points),
            entering,
            np.bincount(coarse[event], weights=(v[event] > 0) * 1.0, minlength=n_points),
            np.bincount(coarse[event], weights=v[event], minlength=n_points),
            (v * event) @ X,
        )

    def sums(self, beta: np.ndarray) -> WeightedGridSums:
        """The grid sums at ``beta``. ``w = v exp(x' beta)`` without a shift: sites' sums
        are added, so they must share one scale. ``ValueError`` when ``x' beta`` overflows."""
        by_group = self.by_point.sums(beta)
        # the rows at point j are groups 2j and 2j + 1, the events group 2j + 1
        S0, S1, S2 = (sums[0::2] + sums[1::2] for sums in by_group)
        E0, E1, E2 = (np.ascontiguousarray(sums[1::2]) for sums in by_group)
        # risk sets are suffixes of the grid: reverse cumulative sums (less rows entering later)
        S0, S1, S2 = (np.cumsum(sums[::-1], axis=0)[::-1] for sums in (S0, S1, S2))
        if self.entering is not None:
            later = self.entering.sums(beta)
            S0, S1, S2 = (
                sums - np.cumsum(entered[::-1], axis=0)[::-1]
                for sums, entered in zip((S0, S1, S2), later, strict=True)
            )
        return WeightedGridSums(
            self.d.copy(),
            np.ascontiguousarray(S0),
            np.ascontiguousarray(S1),
            np.ascontiguousarray(S2),
            E0,
            E1,
            E2,
            self.x_events.copy(),
            self.d_weighted.copy(),
        )


_BLOCK_BYTES = 1 << 20
"""The products of one block of rows taken at once by :meth:`GroupedRows.sums` (1 MiB)."""


def packed_size(p: int) -> int:
    """The numbers in the upper triangle of a ``p x p`` symmetric matrix: ``p (p + 1) / 2``."""
    return p * (p + 1) // 2


def pack_symmetric(full: np.ndarray) -> np.ndarray:
    """The upper triangles, row by row, of ``(..., p, p)`` symmetric matrices."""
    rows, columns = np.triu_indices(full.shape[-1])
    return np.ascontiguousarray(full[..., rows, columns])


def unpack_symmetric(upper: np.ndarray, p: int) -> np.ndarray:
    """``(..., p, p)`` symmetric matrices from their upper triangles (:func:`pack_symmetric`);
    ``ValueError`` when the last axis is not ``p (p + 1) / 2`` long."""
    if upper.shape[-1] != packed_size(p):
        raise ValueError(f"a packed {p} x {p} matrix has {packed_size(p)} numbers")
    full = np.empty((*upper.shape[:-1], p, p))
    rows, columns = np.triu_indices(p)
    full[..., rows, columns] = upper
    full[..., columns, rows] = upper
    return full


def grid_partial_likelihood(sums: GridSums, beta: np.ndarray, ties: str) -> PartialLikelihood:
    """The pooled log partial likelihood, score and information from summed :class:`GridSums`.

    Efron's terms need only sums over ``l = 0..d-1`` of ``1/den``, ``f/den``,
    ``1/den^2``, ``f/den^2``, ``f^2/den^2`` with ``den = S0 - f E0``, ``f = l/d``.
    """
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    d = np.round(sums.d).astype(np.int64)
    points = np.flatnonzero(d > 0)
    d = d[points]
    # one (point, l) pair per event, the pairs of a point side by side: f = l / d (Efron) or
    # 0 (Breslow), counting the events' mean frequency weight m (1 without weights)
    first = np.cumsum(d) - d  # each point's first pair
    n_events = int(d.sum())
    if ties == "efron":
        f = (np.arange(n_events) - np.repeat(first, d)) / np.repeat(d, d)
    else:
        f = np.zeros(n_events)
    m = np.repeat(sums.weighted_events[points] / d, d)
    den = np.repeat(sums.S0[points], d) - f * np.repeat(sums.E0[points], d)
    # each event's m / den, then times f and 1 / den as the terms need, written in place
    terms = np.empty((5, n_events))
    m_inv, f_m_inv, m_inv2, f_m_inv2, ff_m_inv2 = terms
    np.divide(m, den, out=m_inv)
    np.multiply(f, m_inv, out=f_m_inv)
    np.divide(m_inv, den, out=m_inv2)
    np.multiply(f, m_inv2, out=f_m_inv2)
    np.multiply(f, f_m_inv2, out=ff_m_inv2)
    inv, f_inv, inv2, f_inv2, ff_inv2 = (
        np.add.reduceat(terms, first, axis=1) if len(points) else np.zeros((5, 0))
    )
    S1, E1 = sums.S1[points], sums.E1[points]
    # numpy.dot, not @: it releases the interpreter lock (fedstats.site.row_blocks)
    loglik = float(np.dot(beta, sums.x_events) - np.dot(m, np.log(den)))
    score = sums.x_events - np.dot(S1.T, inv) + np.dot(E1.T, f_inv)
    n_points, p = len(sums.d), len(beta)

    def over_grid(values: np.ndarray) -> np.ndarray:  # 0 at the points without events
        full = np.zeros(n_points)
        full[points] = values
        return full

    # sum_j inv_j S2_j - f_inv_j E2_j on the packed upper triangles, then unpacked
    information = unpack_symmetric(
        np.dot(over_grid(inv), sums.S2) - np.dot(over_grid(f_inv), sums.E2), p
    )
    cross = np.dot((S1 * f_inv2[:, None]).T, E1)
    information += cross + cross.T
    information -= np.dot((S1 * inv2[:, None]).T, S1) + np.dot((E1 * ff_inv2[:, None]).T, E1)
    return PartialLikelihood(loglik, score, information)


# ----------------------------------------------------------------------------- concordance
def concordance_counts(
    time: np.ndarray, event: np.ndarray, risk: np.ndarray
) -> tuple[int, int, int]:
    """Harrell's C pair counts ``(concordant, tied_risk, comparable)`` of one set of patients.

    A pair is comparable when the shorter follow-up ends in an event, or when
    an event and a censoring share a time (the censored patient outlived the
    event); two events at one time are not comparable. It is concordant when
    the patient who failed first has the higher risk score ``x' beta``, and
    counts 1/2 when the scores tie (Harrell, Califf, Pryor, Lee & Rosati,
    JAMA 1982; the conventions of lifelines' ``concordance_index``). Counted
    in ``O(n log n)`` with a Fenwick tree over score ranks, adding patients in
    decreasing time.
    """
    event = event.astype(bool)
    ranks = np.unique(risk, return_inverse=True)[1] + 1  # 1-based ranks of the scores
    size = int(ranks.max()) if len(ranks) else 0
    tree = np.zeros(size + 1, dtype=np.int64)

    def add(position: int) -> None:
        while position <= size:
            tree[position] += 1
            position += position & -position

    def below(position: int) -> int:  # how many added scores have rank <= position
        total = 0
        while position > 0:
            total += tree[position]
            position -= position & -position
        return int(total)

    order = np.lexsort((~event, -time))  # by time, decreasing; at one time censored first
    concordant = tied = comparable = added = 0
    start = 0
    while start < len(order):
        stop = start
        while stop < len(order) and time[order[stop]] == time[order[start]]:
            stop += 1
        group = order[start:stop]
        for i in group[~event[group]]:  # censored at this time: comparable to its events
            add(int(ranks[i]))
            added += 1
        for i in group[event[group]]:
            lower, upto = below(int(ranks[i]) - 1), below(int(ranks[i]))
            concordant += lower
            tied += upto - lower
            comparable += added
        for i in group[event[group]]:
            add(int(ranks[i]))
            added += 1
        start = stop
    return concordant, tied, comparable


# ----------------------------------------------------------------------------- robust variance
def score_residuals(data: SortedSurvival, beta: np.ndarray) -> np.ndarray:
    """Breslow-type score residuals (Lin & Wei, JASA 1989), one row per sorted patient.

    ``r_i = sum_j (dN_i(t_j) - Y_i(t_j) w_i dL_j) (x_i - xbar_j)`` over the event
    times ``t_j`` of i's stratum, with ``dL_j = d_j / S0_j`` and
    ``xbar_j = S1_j / S0_j``: the patient's own term when it fails, less its
    share of every risk set it belongs to. Computed with cumulative sums over
    event times, as statsmodels' ``PHReg.score_residuals`` defines them (for
    either ties method). The residuals of a stratum sum to its score.
    """
    X, stratum = data.X, data.stratum
    n, p = X.shape
    if len(data.tie_events) == 0:
        return np.zeros((n, p))
    eta = X @ beta
    w = np.exp(eta - _stratum_max(eta, stratum))
    S0 = _reverse_cumsum_by_stratum(w, stratum)[data.risk_start]
    S1 = _reverse_cumsum_by_stratum(w[:, None] * X, stratum)[data.risk_start]
    hazard = data.tie_events / S0
    mean = S1 / S0[:, None]
    at_time = np.zeros(n)
    np.add.at(at_time, data.risk_start, hazard)
    weighted = np.zeros((n, p))
    np.add.at(weighted, data.risk_start, hazard[:, None] * mean)
    cumulative = _cumsum_by_stratum(at_time, stratum)  # sum of dL_j over t_j <= T_i
    cumulative_mean = _cumsum_by_stratum(weighted, stratum)  # sum of dL_j xbar_j
    residuals = -w[:, None] * (X * cumulative[:, None] - cumulative_mean)
    events = np.flatnonzero(data.event)
    residuals[events] += X[events] - mean[data.event_group]
    return residuals
