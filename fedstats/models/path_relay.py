"""The coordinator's half of the path rules: carry each round's signed replies to the next.

Sites that verify paths (:mod:`fedstats.site.verified_paths`) answer an exact
round only at a point they re-derive from the replies of the last point every
site answered. :class:`PathRelay` keeps those signed replies
(:attr:`fedstats.models.federation.Federation.signed_replies`) and writes the
``path`` argument of the next request (:class:`fedstats.contract.paths.PathRequest`):
the fit's sites, the round, the point's base, the last answered point and, when
that point was a trial, the base it was tried from. The coordinator's steps
are those of the contract (:mod:`fedstats.contract.newton`), so an honest
fit's requests always pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.paths import (
    FIT_KEY,
    PATH_KEY,
    POINT_ARGUMENTS,
    Evaluated,
    PathRequest,
    point_digest,
)
from fedstats.models.federation import Federation


class PathRelay:
    """The path of one iterative exact fit over ``federation``; it adds nothing when
    ``enabled`` is false or when no site of the federation verifies paths (their fingerprints
    say so: :attr:`fedstats.models.federation.Federation.path_sites`), sparing every round
    the relayed replies. Inside secure aggregation the relayed replies are the signed masked
    ones with the self-mask seeds the coordinator rebuilt (:attr:`Evaluated.seeds`): every
    site recomputes their total, as the coordinator did."""

    def __init__(self, federation: Federation, *, enabled: bool = True) -> None:
        self.federation = federation
        self.enabled = enabled and federation.path_sites != set()
        self.sites = tuple(sorted(federation.sites))
        self.round = 0
        self.last: Evaluated | None = None
        self._answered: dict[str, Evaluated] = {}
        self._relayed: set[str] = set()  # the points the last request relayed in full

    def arguments(self, args: dict[str, Any], beta: np.ndarray, base: np.ndarray) -> dict:
        """``args`` with the path of a request at ``beta`` stepped from ``base``. A trial's
        base whose replies the last request relayed in full goes without them
        (:attr:`fedstats.contract.paths.PathRequest.accepted_kept`): the sites that verify
        kept their total, and the others read no relayed reply."""
        if not self.enabled:
            return args
        self.round += 1
        accepted = None
        if self.last is not None and not self.last.is_base:
            accepted = self._answered.get(point_digest(self.last.base))
        kept = accepted is not None and point_digest(accepted.beta) in self._relayed
        own = np.array_equal(beta, base)  # a base of its own: not sent twice
        path = PathRequest(self.sites, self.round,
                           None if own else np.array(base, dtype=np.float64),
                           previous=self.last, accepted=accepted,
                           accepted_kept=kept)  # fmt: skip
        self._relayed = {point_digest(p.beta) for p in (self.last, accepted)
                         if p is not None and not (p is accepted and kept)}  # fmt: skip
        return {**args, PATH_KEY: path.to_wire()}

    def answered(self, beta: np.ndarray, base: np.ndarray) -> None:
        """Keep the signed replies of the request just answered at ``beta`` (every site's, or
        none: sites without a pinned key sign nothing)."""
        if not self.enabled:
            return
        replies = dict(self.federation.signed_replies)
        if set(replies) != set(self.sites):
            return
        seeds = dict(self.federation.mask_seeds) or None  # a masked round: its seeds too
        point = Evaluated(np.array(beta, dtype=np.float64), self.round,
                          np.array(base, dtype=np.float64), replies, seeds)  # fmt: skip
        self.last = point
        self._answered[point_digest(point.beta)] = point


def fit_evidence(
    path: PathRelay | None,
    request: tuple[str, dict[str, Any]] | None,
    beta: np.ndarray | None = None,
) -> dict[str, Any] | None:
    """What an evaluation of a fit relays so that sites which did not keep its points
    (held-out sites of the study) can check it: the fit's last answered point with every
    site's signed reply there, and the task and arguments those replies answer (``None``
    when the fit's sites signed nothing). With ``beta``, the fit must end at that point (a
    Cox fit ends at its last accepted point; ``None`` otherwise); without it, the sites
    check the end point themselves (a logistic fit ends one Newton step past its last
    answered point, which every site re-derives from the relayed replies)."""
    if path is None or request is None or not path.enabled or path.last is None:
        return None
    if beta is not None and not np.array_equal(path.last.beta, np.asarray(beta, np.float64)):
        return None
    task, args = request
    return {
        **PathRequest(path.sites, path.round + 1, None, previous=path.last).to_wire(),
        FIT_KEY: {
            "task": task,
            "args": {k: v for k, v in args.items() if k not in POINT_ARGUMENTS},
        },
    }
