"""Sites and coordinator in one process: the :class:`Federation` users import from ``fedstats``.

The coordinator (:class:`fedstats.models.federation.Federation`) reaches sites only
through transports, and a site (:class:`fedstats.site.silo.Silo`) answers only
encoded requests; neither imports the other. Running every site in this process
needs both, so it lives here, above them: :class:`Federation` is the coordinator's
class with two more constructors, :meth:`Federation.in_process` (one
:class:`~fedstats.site.silo.Silo` per data frame, each behind the codec and its
own checks, exactly as a remote site) and :meth:`Federation.in_process_arrays`
(the same from numpy arrays). Everything else — requests, reply checks, the
message inventory — is the coordinator's, unchanged; a federation of remote
sites (Flower) is the coordinator's class alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

import accounting
from fedstats.errors import FedstatsError, StudyConfigurationError
from fedstats.models import federation as coordinator
from fedstats.models.federation import check_fingerprints
from fedstats.secagg.roster import in_process_pins, joined_pins
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.protocol import Protocol
from fedstats.site.resource_limits import RequestLimits
from fedstats.site.silo import Silo
from fedstats.site.task import TaskRegistry
from harmonize.fingerprint import FINGERPRINT_ATTR
from linkage import LinkageSchema


class Federation(coordinator.Federation):
    """A federation (:class:`fedstats.models.federation.Federation`) that can also run its
    sites in this process: :meth:`in_process`, :meth:`in_process_arrays`. The sites of an
    in-process federation answer a round's exact statistical requests at once, each in a
    worker thread, as remote sites do (:class:`SiteThreads`); replies are read, checked
    and recorded site by site, in order, as for any federation."""

    site_threads: SiteThreads | None = None
    _concurrent: bool = False

    def gather(
        self,
        task: str,
        args: Mapping[str, Any],
        *,
        analysis: str,
        sites: Sequence[str] | None = None,
        site_args: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, FedstatsError]]:
        outer = self._concurrent  # a request made inside another (fingerprints first)
        self._concurrent = (
            self.site_threads is not None
            and not site_args  # one site's own fields: a secure-aggregation round, in turn
            and answers_concurrently(task, args)
        )
        try:
            return super().gather(task, args, analysis=analysis, sites=sites, site_args=site_args)
        finally:
            self._concurrent = outer

    def _dispatch(self, sites: list[str], request_bytes: bytes) -> None:
        """Start the request at every site when it may run at all of them at once."""
        if self._concurrent and self.site_threads is not None:
            self.site_threads.start(sites, request_bytes)

    @classmethod
    def in_process(
        cls,
        frames: Mapping[str, pd.DataFrame],
        *,
        disclosure: DisclosurePolicy | None = None,
        study: str = "study",
        registry: TaskRegistry | None = None,
        ledgers: Mapping[str, accounting.Ledger] | None = None,
        ledger: accounting.Ledger | None = None,
        noise_seed: int | None = None,
        protocols: Mapping[str, Protocol] | None = None,
        verified_paths: bool = True,
        trusts_client_level: bool = False,
        keys_of: coordinator.Federation | None = None,
        limits: RequestLimits | None = None,
        identifiers: Mapping[str, pd.DataFrame] | None = None,
        linkage: Mapping[str, Any] | LinkageSchema | None = None,
    ) -> Federation:
        """All sites in this process, each behind its own :class:`Silo` and the codec.

        ``disclosure`` is the study's disclosure policy, applied by every site
        (default: threshold of 10 patients). ``ledgers`` gives each site its
        own privacy ledger (record-level budgets, set by the site); ``ledger``
        is the coordinator's (client-level). ``noise_seed`` fixes every
        party's privacy noise for tests and reproducibility runs (site ``i``
        uses ``noise_seed + i + 1``); fits then report it. ``protocols``
        gives sites the protocol their privacy officer approved (optional here).
        ``verified_paths`` (default): every site answers an exact iterative fit only at the
        points it re-derives (:mod:`fedstats.site.verified_paths`); switching it off lets the
        coordinator choose the coefficients of exact requests (tests of other rules only).
        ``trusts_client_level``: the sites still answer client-level private fits, whose
        coefficients carry the coordinator's noise (:class:`fedstats.site.silo.Silo`).
        ``keys_of``: another in-process federation of the same study (e.g. the training
        sites, for sites holding held-out rows): its sites' keys join the roster every site
        pins, and a site of the same name signs with that site's key, so these sites can check
        the signed replies of its fits (a trained network's evaluation,
        :mod:`fedstats.site.verified_paths`).
        ``limits``: every site's resource limits per request
        (:class:`fedstats.site.resource_limits.RequestLimits`; default: the site's defaults),
        e.g. raised for a pooled Cox model on a fine grid, whose relayed rounds are large.
        ``identifiers``: the identifier table of each site that takes part in record
        linkage (``Harmonized.identifiers``, same index as its frame), kept at the site;
        ``linkage``: the study specification's ``[linkage]`` table (``StudySpec.linkage``),
        which every site given identifiers encodes under (:func:`fedstats.link`).
        """
        if not isinstance(frames, Mapping) or not frames:
            raise StudyConfigurationError(
                "Federation.in_process needs a mapping of site name to DataFrame"
            )
        check_fingerprints(
            {
                name: frame.attrs.get(FINGERPRINT_ATTR)
                for name, frame in frames.items()
                if isinstance(frame, pd.DataFrame)
            }
        )
        ledgers = dict(ledgers or {})
        protocols = dict(protocols or {})
        identifiers = dict(identifiers or {})
        unknown = sorted((set(ledgers) | set(protocols) | set(identifiers)) - set(frames))
        if unknown:
            raise StudyConfigurationError(
                f"ledgers, protocols or identifiers given for unknown sites {unknown}"
            )
        if identifiers and linkage is None:
            raise StudyConfigurationError(
                "identifiers need the study specification's [linkage] table: linkage=spec.linkage"
            )
        # The sites are the frames in hand: each pins the others' keys, so no session can
        # name an invented site (fedstats.secagg.roster).
        pins = in_process_pins(list(frames))
        if keys_of is not None:
            pins = joined_pins(
                pins,
                {n: s.pin for n, s in getattr(keys_of, "silos", {}).items() if s.pin is not None},
            )
        silos = {
            name: Silo(
                name,
                frame,
                policy=disclosure,
                registry=registry,
                ledger=ledgers.get(name),
                noise_seed=None if noise_seed is None else noise_seed + i + 1,
                protocol=protocols.get(name),
                secure_aggregation=pins[name],
                verified_paths=verified_paths,
                trusts_client_level=trusts_client_level,
                limits=limits,
                identifiers=identifiers.get(name),
                linkage=linkage if name in identifiers else None,
            )
            for i, (name, frame) in enumerate(frames.items())
        }
        sites = SiteThreads({name: silo.handle for name, silo in silos.items()})
        federation = cls(
            {name: partial(sites.answer, name) for name in silos},
            study=study,
            registry=registry,
            ledger=ledger,
            noise_seed=noise_seed,
        )
        federation.silos = silos
        federation.site_threads = sites
        federation.path_sites = {n for n, silo in silos.items() if silo.verifies_paths}
        federation.site_protocols = {
            name: None if silo.protocol is None else silo.protocol.digest
            for name, silo in silos.items()
        }
        return federation

    @classmethod
    def in_process_arrays(
        cls,
        arrays: Mapping[str, tuple[np.ndarray, np.ndarray]],
        *,
        columns: Sequence[str] | None = None,
        outcome: str = "y",
        disclosure: DisclosurePolicy | None = None,
        study: str = "study",
    ) -> Federation:
        """All sites in this process from ``(X, y)`` arrays, for numpy users.

        Each site's ``X`` becomes a frame with ``columns`` (default ``x1..xp``)
        and its ``y`` the column ``outcome``; fit with
        ``LogisticRegression.from_columns(outcome, columns)``.
        """
        frames = {}
        for site, pair in arrays.items():
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise StudyConfigurationError(f"site {site!r}: expected an (X, y) pair of arrays")
            X, y = np.asarray(pair[0], dtype=float), np.asarray(pair[1])
            if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
                raise StudyConfigurationError(
                    f"site {site!r}: X must be 2-D and y 1-D with as many rows "
                    f"(got shapes {X.shape} and {y.shape})"
                )
            names = (
                list(columns) if columns is not None else [f"x{j + 1}" for j in range(X.shape[1])]
            )
            if len(names) != X.shape[1] or outcome in names:
                raise StudyConfigurationError(
                    f"site {site!r}: {X.shape[1]} columns in X but names {names} "
                    f"(the outcome {outcome!r} may not be among them)"
                )
            frame = pd.DataFrame(X, columns=names)
            frame[outcome] = y
            frames[site] = frame
        return cls.in_process(frames, disclosure=disclosure, study=study)


CONCURRENT_TASKS = frozenset(
    {
        "prepare",
        "logistic.summaries",
        "logistic.evaluate",
        "glm.summaries",
        "cox.summaries",
        "cox.grid_summaries",
        "cox.robust",
        "cox.concordance",
        "fine_gray.grid_summaries",
        "fine_gray.robust",
        "survival.counts",
        "competing.counts",
    }
)
"""Tasks whose exact handlers only read their own site's frame with numpy and pandas: a
round of one may run at every in-process site at once. Not here: private releases (a site's
ledger is a connection of the thread that opened it), secure aggregation (sessions and
shares), and training (torch's generator is the process's)."""


def answers_concurrently(task: str, args: Mapping[str, Any]) -> bool:
    """Whether a request may run at every in-process site at once: an exact request of a
    :data:`CONCURRENT_TASKS` task, outside secure aggregation."""
    return task in CONCURRENT_TASKS and args.get("dp") is None and args.get("secagg") is None


_WORKERS: dict[int, ThreadPoolExecutor] = {}
_WORKERS_LOCK = threading.Lock()


def _workers() -> ThreadPoolExecutor | None:
    """This process's site workers, one per processor (``None`` on one processor); a child
    process forked from one that had workers starts its own (threads do not survive a
    fork)."""
    processors = os.cpu_count() or 1
    if processors < 2:
        return None
    with _WORKERS_LOCK:
        pid = os.getpid()
        if pid not in _WORKERS:
            _WORKERS.clear()
            _WORKERS[pid] = ThreadPoolExecutor(processors, thread_name_prefix="fedstats-site")
        return _WORKERS[pid]


class SiteThreads:
    """The in-process sites' handlers, run in worker threads when a round is started at all
    of them (:meth:`start`); :meth:`answer` is each site's transport.

    Each site answers its own requests one at a time, in the order they were sent: a
    request started in a worker is collected before the site answers another. The sites
    share nothing a handler writes (each has its own frame, policy, cache, guard and
    keys), so a reply is the bytes the site gives when asked alone.
    """

    def __init__(self, handlers: Mapping[str, Callable[[bytes], bytes]]) -> None:
        self._handlers = dict(handlers)
        self._pending: dict[str, tuple[bytes, Future[bytes]]] = {}

    def start(self, sites: Sequence[str], request: bytes) -> None:
        """Send ``request`` to each of ``sites`` in a worker thread."""
        workers = _workers()
        if workers is None:
            return
        for site in sites:
            self._collect(site)
            self._pending[site] = (request, workers.submit(self._handlers[site], request))

    def answer(self, site: str, request: bytes) -> bytes:
        """The site's reply to ``request``: the one its worker computed when the request was
        started there, else computed now."""
        pending = self._pending.get(site)
        if pending is not None and pending[0] is request:
            del self._pending[site]
            return pending[1].result()
        self._collect(site)
        return self._handlers[site](request)

    def _collect(self, site: str) -> None:
        """Wait for a request started at ``site`` and never read (a round left off)."""
        pending = self._pending.pop(site, None)
        if pending is not None:
            wait([pending[1]])
