"""Path rules: the only points at which a site answers an exact request of an iterative fit.

An exact federated fit asks every site for sums at coefficients the
coordinator sends. Were the coordinator free to choose them, huge
coefficients would turn ``mu = expit(x' beta)`` into the indicator of a
half-space and the sums into rows (the multi-step inferential disclosure of
Huth et al., *Bioinformatics* 2022). So a site answers an exact request of
such a fit only at a point it re-derives itself:

* round 1 at the rule's start (zeros for Newton's method on a likelihood);
* round ``t > 1`` at ``beta_{t-1} + step``, the step computed with the same
  contract code the coordinator uses (:func:`fedstats.contract.newton.newton_step`)
  from the round ``t - 1`` replies of every site of the fit, relayed by the
  coordinator, each signed by its site (:func:`statement`).

Each reply is signed over the task, the design, the fit's sites, the
round, the point and the reply itself, so a site checks that every relayed
reply was answered at the previous point by the site it names (with the key
its roster pins), and a site signs only at points it verified: by induction
every answered point lies on the path an honest fit of these sites' data
takes. Relaying a site's reply to the other sites discloses nothing new: it
already passed that site's rules for an untrusted recipient.

A requested point agrees with the derived one when each coefficient lies
within :data:`TOLERANCE` standard errors of it (``sqrt`` of the diagonal of
the inverse summed information): sites summing in another order, or on
another BLAS, differ by rounding far below that, and a coordinator moving a
coefficient by more is refused (rule ``path``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract import codec
from fedstats.contract.newton import inverse_information, newton_step

TOLERANCE = 1e-6
"""How far, in standard errors, a requested coefficient may lie from the re-derived one."""

MAX_ROUND = 10_000
"""The most rounds a path may have (a Newton fit converges in tens)."""

PATH_KEY = "path"
"""The request argument carrying a fit's path (:class:`PathRequest` on the wire)."""


@dataclass(frozen=True)
class NewtonPath:
    """Newton's method on summed score and information (logistic regression): start at 0,
    then ``beta + H^-1 g`` with ``g`` and ``H`` the sums of every site's ``score`` and
    ``information`` fields at ``beta`` (Wu et al., JAMIA 2012)."""

    score: str = "gradient"
    information: str = "hessian"

    def start(self, p: int) -> np.ndarray:
        return np.zeros(p)

    def next_point(
        self, beta: np.ndarray, replies: Mapping[str, Mapping[str, Any]]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The next point and the summed information it was derived from (``None`` where the
        information is singular: the path ends there)."""
        score = summed(replies, self.score)
        information = summed(replies, self.information)
        step = newton_step(information, score, [], first=False)
        if step is None or not np.isfinite(step).all():
            return None
        return beta + step, information


def summed(replies: Mapping[str, Mapping[str, Any]], field: str) -> np.ndarray:
    """The sum of one field over the replies, in the sites' sorted order (every side sums
    alike)."""
    return sum(np.asarray(replies[site][field], dtype=np.float64) for site in sorted(replies))


def deviation(requested: np.ndarray, derived: np.ndarray, information: np.ndarray) -> float:
    """The largest ``|requested_j - derived_j| / se_j``, ``se`` from the inverse information
    (``inf`` when it cannot be inverted or a coefficient is not finite)."""
    if not (np.isfinite(requested).all() and np.isfinite(derived).all()):
        return float("inf")
    covariance = inverse_information(information)
    variance = np.diag(covariance)
    if not (np.isfinite(variance).all() and (variance > 0).all()):
        return float("inf")
    return float(np.max(np.abs(requested - derived) / np.sqrt(variance), initial=0.0))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def design_digest(design: Any) -> str:
    """The digest of a request's ``design`` argument as the codec writes it."""
    return digest(codec.encode(design))


def statement(
    *,
    task: str,
    design: str,
    sites: Sequence[str],
    round: int,
    beta: np.ndarray,
    reply: Mapping[str, Any],
    verified: bool,
) -> bytes:
    """The bytes a site signs over its answer at one point of a path: canonical JSON of the
    task, design digest, the fit's sites, the round, the point's digest (its float64 bytes)
    and the reply's digest (the codec's bytes of the payload), and whether the site verified
    the point before answering. The signing keys are the study's (its pinned roster), which
    ties the statement to the study."""
    record = {
        "kind": "fedstats path reply v1",
        "task": task,
        "design": design,
        "sites": sorted(sites),
        "round": int(round),
        "beta": digest(np.ascontiguousarray(beta, dtype="<f8").tobytes()),
        "reply": digest(codec.encode(dict(reply))),
        "verified": bool(verified),
    }
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SignedReply:
    """One site's reply at a point of a path, its signature (hex), and whether the site
    verified the point (what its signature says), as relayed."""

    reply: Mapping[str, Any]
    signature: str
    verified: bool

    def to_wire(self) -> dict[str, Any]:
        return {"reply": dict(self.reply), "signature": self.signature, "verified": self.verified}


@dataclass(frozen=True)
class PathRequest:
    """Where a request stands on its fit's path: the sites whose sums make the path, the
    round, and (after round 1) the previous point and every site's signed reply there."""

    sites: tuple[str, ...]
    round: int
    previous: np.ndarray | None = None
    replies: Mapping[str, SignedReply] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"sites": list(self.sites), "round": self.round}
        if self.previous is not None and self.replies is not None:
            wire["previous"] = self.previous
            wire["replies"] = {s: r.to_wire() for s, r in sorted(self.replies.items())}
        return wire
