"""The graph of a secure-aggregation session: who shares its secrets with, and masks against, whom.

Bonawitz et al. (CCS 2017) use the complete graph: each of ``n`` sites Shamir-shares its
self-mask seed ``b_u`` and masking key ``s_u`` with every other site and masks pairwise
against every other, so each site's messages grow with ``n``. SecAgg+ (Bell, Bonawitz,
Gascón, Lepoint & Raykova, "Secure single-server aggregation with (poly)logarithmic
overhead", CCS 2020, §3) replaces it by a ``k``-regular graph with ``k = O(log n)``: the
Harary graph ``H(k, n)`` with its vertices labelled at random. Here the session's sites are
placed on a ring in an order drawn from a seed (:func:`ring_order`) and each site's
neighbours are the ``k/2`` nearest on either side. A site's *holders* are itself and its
``k`` neighbours; it shares ``b_u`` and ``s_u`` among them with threshold ``t_k``, and
masks pairwise only with its neighbours.

The degree and the per-neighbourhood threshold (:func:`neighbourhood`) follow from the
session's ``n`` sites and threshold ``t`` (so at most ``n - t`` sites may drop out):

* privacy, in this project's threat model (no site colludes with the coordinator), needs
  ``t_k >= k/2 + 2`` and one survivor set that every unmasking site signed
  (:mod:`fedstats.site.secure_unmasking`). The survivors' graph is cut only by ``k/2``
  consecutive non-survivors on the ring; a survivor next to such a run keeps at most
  ``k/2 + 1`` holders among the survivors, fewer than ``t_k``, so its self-mask cannot be
  removed and no part of the survivors' sum can be unmasked apart from the rest;
* correctness, Bell et al.'s condition that every site keeps ``t_k`` surviving holders, for
  ``n - t`` dropouts placed at random on the ring (the order is random): a site fails when
  more than ``k - t_k`` of its ``k`` neighbours drop out, with probability at most
  ``n P[Hyp(n - 1, n - t, k) > k - t_k] <= 2^-CORRECTNESS_BITS``;
* Bell et al.'s two conditions against colluding sites, evaluated for a fraction
  :data:`COLLUDING` of the sites at statistical security ``2^-SECURITY_BITS`` — a margin
  beyond the threat model, which is what makes ``k`` grow like ``log n``: no site has
  ``t_k`` colluding holders, ``n P[Hyp(n - 1, c, k) >= t_k] <= 2^-SECURITY_BITS``, and the
  colluders never fill ``k/2`` consecutive places of the ring (which would cut the honest
  sites apart), ``n P[Hyp(n, c, k/2) = k/2] <= 2^-SECURITY_BITS``, with ``c = ceil(n/20)``.

The smallest even ``k >= 4`` meeting all three is used, with the ``t_k`` that leaves the
widest margin. Bell et al. bound these tails with Chernoff bounds; here they are summed
exactly with integer binomial coefficients, so the coordinator and every site compute the
same ``(k, t_k)`` from ``(n, t)`` on any machine. When no ``k`` below ``n/2`` qualifies
(``n <= 2k``: few sites, or many dropouts tolerated) the graph is complete and ``t_k = t``:
the construction of Bonawitz et al.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

SECURITY_BITS = 40
"""``sigma``: the colluding-site conditions fail with probability at most ``2^-40``."""
CORRECTNESS_BITS = 30
"""``eta``: ``n - t`` random dropouts leave some site short of holders with probability at
most ``2^-30`` (the session then aborts; nothing is unmasked)."""
COLLUDING = Fraction(1, 20)
"""The fraction of colluding sites the graph is sized for (beyond the threat model)."""
LEAST_DEGREE = 4


@dataclass(frozen=True)
class Neighbourhood:
    """A session's degree ``k`` and per-neighbourhood threshold ``t_k``.

    ``complete``: the complete graph (``k = n - 1``, ``t_k = t``)."""

    degree: int
    share_threshold: int
    complete: bool


def complete(parties: int, threshold: int) -> Neighbourhood:
    """The complete graph of Bonawitz et al.: every site a neighbour of every other."""
    return Neighbourhood(parties - 1, threshold, True)


@lru_cache(maxsize=1024)
def neighbourhood(parties: int, threshold: int) -> Neighbourhood:
    """The SecAgg+ graph's ``(k, t_k)`` for ``parties`` sites and threshold ``threshold``.

    Parameters
    ----------
    parties:
        ``n``, the session's sites.
    threshold:
        ``t``, the fewest survivors; ``n - t`` dropouts are tolerated.

    Returns
    -------
    Neighbourhood
        The smallest even degree meeting the conditions of the module docstring, and the
        threshold among its ``k + 1`` holders leaving the widest margin; the complete graph
        when no degree below ``n/2`` meets them.
    """
    dropouts = parties - threshold
    colluders = math.ceil(parties * COLLUDING)
    security, correctness = Fraction(1, 2**SECURITY_BITS), Fraction(1, 2**CORRECTNESS_BITS)
    for k in range(LEAST_DEGREE, parties, 2):
        if 2 * k >= parties:
            break
        if parties * _at_least(parties, colluders, k // 2, k // 2) > security:
            continue
        dropped = _tail_table(parties - 1, dropouts, k)
        colluding = _tail_table(parties - 1, colluders, k)
        best: tuple[Fraction, int] | None = None
        for share_threshold in range(k // 2 + 2, k + 1):
            fails = parties * dropped[k - share_threshold + 1]
            exposed = parties * colluding[share_threshold]
            if fails > correctness or exposed > security:
                continue
            margin = max(fails / correctness, exposed / security)
            if best is None or margin < best[0]:
                best = (margin, share_threshold)
        if best is not None:
            return Neighbourhood(k, best[1], False)
    return complete(parties, threshold)


def _at_least(population: int, marked: int, draws: int, least: int) -> Fraction:
    """``P[X >= least]`` for ``X ~ Hypergeometric(population, marked, draws)``, exactly."""
    return _tail_table(population, marked, draws)[least] if least <= draws else Fraction(0)


@lru_cache(maxsize=4096)
def _tail_table(population: int, marked: int, draws: int) -> tuple[Fraction, ...]:
    """``P[X >= j]`` for ``j = 0..draws + 1`` (the last is 0)."""
    total = math.comb(population, draws)
    mass = [
        Fraction(math.comb(marked, j) * math.comb(population - marked, draws - j), total)
        for j in range(draws + 1)
    ]
    tails = [Fraction(0)] * (draws + 2)
    for j in range(draws, -1, -1):
        tails[j] = tails[j + 1] + mass[j]
    return tuple(tails)


def ring_order(seed: bytes, sites: Sequence[str]) -> tuple[str, ...]:
    """The sites in the ring order the seed draws: sorted by ``SHA-256(seed | site)``, a
    uniformly random permutation for a seed nobody could choose."""

    def place(site: str) -> bytes:
        name = site.encode()
        return hashlib.sha256(seed + len(name).to_bytes(8, "little") + name).digest()

    return tuple(sorted(sites, key=place))


@dataclass(frozen=True)
class Graph:
    """One session's graph: each site's neighbours, listed in the session's order.

    Build it with :func:`session_graph`."""

    sites: tuple[str, ...]
    neighbourhood: Neighbourhood
    _neighbours: dict[str, tuple[str, ...]]

    def neighbours(self, site: str) -> tuple[str, ...]:
        """The sites ``site`` shares its secrets with and masks against (itself excluded)."""
        return self._neighbours[site]

    def holders(self, site: str) -> tuple[str, ...]:
        """Who holds shares of ``site``'s secrets: its neighbours and itself, in session order."""
        mine = set(self._neighbours[site]) | {site}
        return tuple(s for s in self.sites if s in mine)


def session_graph(sites: Sequence[str], shape: Neighbourhood, seed: bytes) -> Graph:
    """The Harary graph ``H(k, n)`` on the ring :func:`ring_order` draws from ``seed`` (the
    complete graph when ``shape.complete``)."""
    sites = tuple(sites)
    if shape.complete:
        return Graph(sites, shape, {s: tuple(v for v in sites if v != s) for s in sites})
    ring = ring_order(seed, sites)
    where = {s: i for i, s in enumerate(ring)}
    index = {s: i for i, s in enumerate(sites)}
    half, n = shape.degree // 2, len(sites)
    neighbours = {}
    for site in sites:
        at = where[site]
        near = {ring[(at + step) % n] for step in range(-half, half + 1) if step != 0}
        neighbours[site] = tuple(sorted(near, key=index.__getitem__))
    return Graph(sites, shape, neighbours)
