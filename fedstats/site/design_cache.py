"""The designs a site built, kept across the rounds of an analysis, in bounded memory.

An iterative fit asks a site for the same agreed design every round; building it (reading
the frame, the model frame, the small-cell rules and the differencing guard) costs more
than a round's sums. A site therefore keeps each design it built, as numpy arrays, under a
key that holds everything the build reads from a request — the design's full wire form
(formula, outcome, agreed levels and columns, sites, offset, weights, exposure, strata,
missing-value rule: :func:`design_digest`, the whole SHA-256) — and whether the release is
exact or private (a private build leaves unusable rows out where an exact one refuses):
:func:`design_key`, also the key of what a handler keeps built from a design (a Cox
model's sorted rows).
Nothing else a coordinator sends is in the key, and nothing in the key is a label it
chooses: a cached design is the design a fresh build of the same request would give.
What the build reads from the site — its policy and name — is fixed for the context that
holds the cache (:class:`~fedstats.site.task.SiteContext`), and its frame is in the key
(:func:`frame_token`).

Only the build is kept: every check of every round still runs (the silo's threshold rule
and reply checks, round counts, verified paths, ledger charges), and a design whose checks
refused it is never kept, so it is refused again. The small-cell rules and the guard run
once per design (:func:`fedstats.site.handlers.design.check_exact_release`), as before.

Memory is bounded in bytes (:data:`DESIGN_CACHE_BYTES` per site), counting what each design
holds itself (:attr:`fedstats.site.handlers.design.SiteDesign.held_bytes`: the whole buffer
under each of its columns, formulaic's model matrix or the complete rows included; a design
of the frame's float columns holds little more than its outcome and rows; the row-major matrix
a Cox or fairness round builds from them is 168 MB at 1,000,000 x 21): the least recently
used designs are dropped first, and a design larger than the bound is not kept (it is
rebuilt each round).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.design import DesignSpec

DESIGN_CACHE_BYTES = 256 * 2**20
"""The most a site keeps of built designs (and their sorted survival forms), per kind."""


def design_digest(spec: DesignSpec) -> str:
    """The full SHA-256 of the design's canonical wire form (64 hex digits)."""
    canonical = json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def design_key(spec: DesignSpec, *, exact: bool, frame: pd.DataFrame) -> tuple:
    """The key of ``spec``'s design, and of every form a handler keeps of it (a Cox model's
    sorted rows): its digest, whether the release is exact, and the frame."""
    return design_digest(spec), exact, frame_token(frame)


def frame_token(frame: pd.DataFrame) -> tuple:
    """What identifies the frame a context's designs were built from: the object, its shape
    and its columns (a site that swaps its frame for another starts new keys; the rows of a
    frame a silo serves cannot be edited in place: :mod:`fedstats.site.frame_layout`)."""
    return (id(frame), frame.shape, tuple(str(c) for c in frame.columns))


def footprint(value: Any) -> int:
    """The bytes of the numpy arrays ``value`` holds: what it says it holds (``held_bytes``,
    a site design, whose columns may be the frame's own), or the arrays of a dataclass,
    tuple, list or dict."""
    held = getattr(value, "held_bytes", None)
    if isinstance(held, int):
        return held
    if isinstance(value, np.ndarray):
        return value.nbytes
    if is_dataclass(value) and not isinstance(value, type):
        return sum(footprint(getattr(value, f.name)) for f in fields(value))
    if isinstance(value, tuple | list):
        return sum(footprint(v) for v in value)
    if isinstance(value, dict):
        return sum(footprint(v) for v in value.values())
    return 0


class BoundedCache:
    """A least-recently-used mapping whose values' arrays hold at most ``max_bytes``."""

    def __init__(self, max_bytes: int = DESIGN_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.nbytes = 0

    def get(self, key: Hashable) -> Any | None:
        """The value kept under ``key`` (now the most recently used), or ``None``. A value may
        have grown since it was kept (a design builds its row-major array on first use): it
        is measured again, and the least recently used values dropped to keep the bound."""
        item = self._items.get(key)
        if item is None:
            return None
        value = item[0]
        self.put(key, value)
        return value if key in self._items else None

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used values until the
        bound holds; a value larger than the bound is not kept."""
        size = footprint(value)
        if key in self._items:
            self.nbytes -= self._items.pop(key)[1]
        if size > self.max_bytes:
            return
        self._items[key] = (value, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.nbytes -= dropped

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
