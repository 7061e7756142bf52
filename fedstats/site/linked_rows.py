"""The linkages a site accepted: which of its patients stand behind each linked pair id.

A vertical study joins a registry's outcome to a hospital's covariates for the same people.
A linkage unit matches the sites' encoded identifiers and gives each site the pair ids of
its matched patients (the ids are the linkage's own; no site learns the other's patient
ids). A site keeps that mapping as :class:`LinkedRows` and answers vertical tasks only
about the patients of a linkage it accepted (:meth:`LinkageStore.accept`, reached through
:meth:`fedstats.site.silo.Silo.accept_linkage`). It refuses a linkage

* of fewer than ``min_count`` pairs (the threshold rule: every vertical aggregate covers
  the linked patients);
* with a pair id or a patient twice, or a patient its frame does not hold;
* whose patients differ from those of a linkage it accepted before on 1 to ``k_cell - 1``
  patients (or whose complement does): two fits over the two linkages would give those
  patients' terms by subtraction, the differencing attack of a coordinator choosing which
  linked ids to fit on (Duncan & Pearson, Stat Sci 1991);
* that reuses an accepted linkage's id for other pairs.

The differencing guard (:mod:`fedstats.site.differencing`) checks the linked rows again with
every other row set the site answered about when a vertical design is first released.

Durability. Given a folder (a deployed site's ``workdir/linkages``), the store writes each
accepted linkage there before it holds it (one JSON file per linkage, named by the SHA-256
of its id, written atomically and readable by the site's user only: it maps the linkage's
pair ids to the site's own patient ids, and never leaves the site) and reads them back when
the site starts, so a linkage made in one run of a site's batch job serves the vertical
fits of the next, and the differencing rule compares a new linkage with every linkage the
site ever accepted. A kept linkage whose patients are no longer all in the frame (the
sources changed) is not loaded, with a warning naming it: link again under a new id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedstats.contract.tasks.vertical import MAX_NAME_CHARS
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.site.disclosure import DisclosurePolicy
from studyfiles.durable import write_atomically

_log = logging.getLogger(__name__)

TASK = "accept_linkage"
"""The name a linkage's refusals carry (the site-local step, later a wire task)."""

FILE_MODE = 0o600
"""A kept linkage is readable and writable by the site's user only."""


@dataclass(frozen=True)
class LinkedRows:
    """One linkage as a site holds it: its id, the pair ids (sorted, unique, int64) and, in
    the same order, the frame index of the patient linked under each pair id."""

    linkage_id: str
    pair_ids: np.ndarray
    patients: np.ndarray

    def __post_init__(self) -> None:
        if not (isinstance(self.linkage_id, str) and 0 < len(self.linkage_id) <= MAX_NAME_CHARS):
            raise MalformedRequestError(
                site=None, task=TASK, reason=f"a linkage id is 1 to {MAX_NAME_CHARS} characters"
            )
        pair_ids = np.asarray(self.pair_ids)
        patients = np.asarray(self.patients)
        if pair_ids.ndim != 1 or pair_ids.dtype.kind not in "iu":
            raise MalformedRequestError(
                site=None, task=TASK, reason="pair_ids must be a one-dimensional integer array"
            )
        if patients.shape != pair_ids.shape:
            raise MalformedRequestError(
                site=None,
                task=TASK,
                reason=f"{len(pair_ids)} pair ids but {len(patients)} patients: one patient "
                "per pair id",
            )
        pair_ids = pair_ids.astype(np.int64)
        pair_ids.flags.writeable = False
        patients = patients.copy()
        patients.flags.writeable = False
        object.__setattr__(self, "pair_ids", pair_ids)
        object.__setattr__(self, "patients", patients)

    @property
    def n_pairs(self) -> int:
        return len(self.pair_ids)


class LinkageStore:
    """A site's accepted linkages by id, with each one's frame rows (positions in pair-id
    order)."""

    def __init__(
        self,
        site: str,
        frame: pd.DataFrame,
        policy: DisclosurePolicy,
        folder: Path | None = None,
    ) -> None:
        self._site = site
        self._frame = frame
        self._policy = policy
        self._accepted: dict[str, tuple[LinkedRows, np.ndarray]] = {}
        self._lock = threading.Lock()
        self._folder = folder
        if folder is not None:
            self._load(folder)

    def accept(self, rows: LinkedRows) -> None:
        """Accept ``rows`` after every check of the module docstring; accepting the same
        linkage twice changes nothing. Raises :class:`~fedstats.errors.DisclosureError`
        (rules ``threshold``, ``differencing``) or
        :class:`~fedstats.errors.MalformedRequestError`, naming the site."""
        if not isinstance(rows, LinkedRows):
            raise MalformedRequestError(
                site=self._site, task=TASK, reason="a linkage is given as LinkedRows"
            )
        positions = self._positions(rows)
        with self._lock:
            held = self._accepted.get(rows.linkage_id)
            if held is not None:
                same = np.array_equal(held[0].pair_ids, rows.pair_ids) and np.array_equal(
                    held[1], positions
                )
                if same:
                    return
                raise self._malformed(
                    f"linkage {rows.linkage_id!r} was accepted with other pairs: a new "
                    "linkage takes a new id"
                )
            self._check_differencing(rows.linkage_id, positions)
            if self._folder is not None:
                self._keep(rows)
            self._accepted[rows.linkage_id] = (rows, positions)

    def rows(self, linkage_id: str, task: str | None = None) -> tuple[LinkedRows, np.ndarray]:
        """The accepted linkage ``linkage_id`` and its frame positions in pair-id order."""
        held = self._accepted.get(linkage_id)
        if held is None:
            raise MalformedRequestError(
                site=self._site,
                task=task,
                reason="this site accepted no linkage of that id; the linkage unit's mapping "
                "must be accepted at the site first",
            )
        return held

    def __contains__(self, linkage_id: object) -> bool:
        return linkage_id in self._accepted

    def _keep(self, rows: LinkedRows) -> None:
        """Write ``rows`` to the store's folder, atomically and durably, mode 0600."""
        assert self._folder is not None
        record = {
            "linkage_id": rows.linkage_id,
            "pair_ids": rows.pair_ids.tolist(),
            "patients": [str(patient) for patient in rows.patients.tolist()],
        }
        path = linkage_file(self._folder, rows.linkage_id)
        write_atomically(path, json.dumps(record).encode("utf-8"), mode=FILE_MODE)

    def _load(self, folder: Path) -> None:
        """Hold every linkage kept in ``folder`` that still fits the frame (module docstring)."""
        if not folder.is_dir():
            return
        labels = {str(label): label for label in self._frame.index}
        for path in sorted(folder.glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                linkage_id = record["linkage_id"]
                if path != linkage_file(folder, linkage_id):
                    raise ValueError("its name is not its linkage id's")
                patients = [labels[str(patient)] for patient in record["patients"]]
                rows = LinkedRows(linkage_id, np.asarray(record["pair_ids"]), np.asarray(patients))
                positions = self._positions(rows)
                self._check_differencing(linkage_id, positions)
            except (KeyError, ValueError, TypeError, DisclosureError, MalformedRequestError) as e:
                _log.warning(
                    "site %s: kept linkage %s is not loaded (%s: %s); link again under a new id",
                    self._site,
                    path.name,
                    type(e).__name__,
                    e,
                )
                continue
            self._accepted[linkage_id] = (rows, positions)

    def _positions(self, rows: LinkedRows) -> np.ndarray:
        """The frame positions of the linked patients, after the checks on the pairs."""
        k_count = self._policy.min_count
        if rows.n_pairs < k_count:
            raise DisclosureError(
                site=self._site,
                task=TASK,
                reason=f"a linkage of fewer pairs than the disclosure threshold of {k_count}",
                rule="threshold",
            )
        if np.any(np.diff(rows.pair_ids) <= 0):
            raise self._malformed("the pair ids must be sorted and each appear once")
        if pd.Index(rows.patients).has_duplicates:
            raise self._malformed("a patient is linked under two pair ids")
        index = self._frame.index
        if index.has_duplicates:
            raise self._malformed(
                "a vertical study links one row per patient: this site's frame holds several "
                "rows for a patient"
            )
        positions = index.get_indexer(pd.Index(rows.patients))
        missing = int((positions < 0).sum())
        if missing:
            raise self._malformed(
                f"{missing} linked patient(s) are not in this site's frame; link the frame the "
                "site answers from"
            )
        return positions.astype(np.int64)

    def _check_differencing(self, linkage_id: str, positions: np.ndarray) -> None:
        k, n = self._policy.k_cell, len(self._frame)
        mask = np.zeros(n, dtype=bool)
        mask[positions] = True
        for other, (_, other_positions) in self._accepted.items():
            held = np.zeros(n, dtype=bool)
            held[other_positions] = True
            differ = int((mask ^ held).sum())
            if 1 <= differ <= k - 1 or 1 <= n - differ <= k - 1:
                raise DisclosureError(
                    site=self._site,
                    task=TASK,
                    reason=f"linkage {linkage_id!r} differs from the accepted linkage "
                    f"{other!r} on fewer than {k} patients (or its complement does): fits "
                    "over the two would give those patients' terms by subtraction",
                    rule="differencing",
                )

    def _malformed(self, reason: str) -> MalformedRequestError:
        return MalformedRequestError(site=self._site, task=TASK, reason=reason)


def linkage_file(folder: Path, linkage_id: str) -> Path:
    """Where ``folder`` keeps linkage ``linkage_id``: named by the id's SHA-256, so no id can
    name a path outside the folder."""
    return folder / f"{hashlib.sha256(linkage_id.encode('utf-8')).hexdigest()}.json"
