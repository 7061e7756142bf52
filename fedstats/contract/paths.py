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
  coordinator, each signed by its site (:func:`statements`).

Each reply is signed over the task, the request, the fit's sites, the
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from fedstats.contract import codec
from fedstats.contract.aggregation import RULE_KEY
from fedstats.contract.aggregation import from_wire as aggregation_rule
from fedstats.contract.fairness import PARITY_FIELDS, penalised, penalty_weight
from fedstats.contract.newton import MAX_HALVINGS, inverse_information, newton_step
from fedstats.contract.quantize import Quantized, dequantize
from fedstats.cox_math import GridSums, WeightedGridSums, grid_partial_likelihood
from fedstats.errors import StudyConfigurationError

TOLERANCE = 1e-6
"""How far, in standard errors, a requested coefficient may lie from the re-derived one."""

MAX_ROUND = 10_000
"""The most rounds a path may have (a Newton fit converges in tens)."""

PATH_KEY = "path"
"""The request argument carrying a fit's path (:class:`PathRequest` on the wire)."""

FIT_KEY = "fit"
"""The argument of an evaluation's ``path`` naming the fit it evaluates: the task of the fit's
rounds and their arguments but the point (what the relayed replies were signed over)."""

CLIENT_LEVEL_KEY = "client_level"
"""A request argument (``true``) marking a round of a client-level private fit that carries no
clipping of its own (DP-FedAvg: the coordinator clips and noises the updates): answered off
any path only by sites that trust the coordinator with client-level fits."""

Replies = Mapping[str, Mapping[str, Any]]
"""Each site's reply at one point, by site."""


@dataclass(frozen=True)
class NewtonPath:
    """Newton's method on summed score and information (logistic regression): start at 0,
    then ``beta + H^-1 g`` with ``g`` and ``H`` the sums of every site's ``gradient`` and
    ``hessian`` at ``beta`` (Wu et al., JAMIA 2012). Every point is its own base: no step is
    halved."""

    damped: bool = False
    seeded_start: bool = False
    """Round 1 starts at a network drawn from the request's ``init_seed``, which only the
    site's deep task can rebuild (it checks it before it trains), not at :meth:`start`."""
    private_rounds: bool = False
    """Record-level private rounds (each site's reply noised and charged by the site itself)
    that carry a path are verified too: the step from the signed noisy replies is as
    deterministic as from exact ones, so the path's end point can be evaluated."""

    def start(self, p: int) -> np.ndarray:
        return np.zeros(p)

    def sums_replies(self, args: Mapping[str, Any]) -> bool:
        """Whether the step reads only the sum over sites of each reply field, so that a site
        can re-derive it from the total of masked replies inside secure aggregation."""
        return True

    def point(self, args: Mapping[str, Any]) -> Any:
        """The request's point (its coefficients ``beta``)."""
        return args.get("beta")

    def close(
        self, requested: np.ndarray, derived: np.ndarray, information: np.ndarray | None
    ) -> bool:
        """Whether a requested point is the derived one: within :data:`TOLERANCE` standard
        errors (:func:`deviation`)."""
        return information is not None and deviation(requested, derived, information) <= TOLERANCE

    def fields(self, p: int, args: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
        """The reply fields the rule reads, with their shapes (``()``: a number)."""
        return {"gradient": (p,), "hessian": (p, p)}

    def evaluate(
        self, replies: Replies, beta: np.ndarray, args: Mapping[str, Any]
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """``(objective, score, information)`` of the summed replies at ``beta`` (plain
        Newton never compares objectives: 0)."""
        return 0.0, summed(replies, "gradient"), summed(replies, "hessian")

    def step(
        self, replies: Replies, beta: np.ndarray, args: Mapping[str, Any]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The Newton step ``H^-1 g`` at ``beta`` and ``H`` (``None`` where ``H`` is singular:
        the path ends there)."""
        _, score, information = self.evaluate(replies, beta, args)
        step = newton_step(information, score, [], first=False)
        if step is None or not np.isfinite(step).all():
            return None
        return step, information

    def next_point(
        self, beta: np.ndarray, replies: Replies, args: Mapping[str, Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The next point and the summed information it was derived from."""
        found = self.step(replies, beta, args or {})
        return None if found is None else (beta + found[0], found[1])


@dataclass(frozen=True)
class DampedNewtonPath(NewtonPath):
    """Newton's method with step halving on a concave objective (GLMs, the Cox models):
    from an accepted point ``a`` (the *base*) the trials are ``a + H_a^-1 g_a / 2^j``,
    ``j = 0 .. max_trials - 1``; a trial becomes the next base only if its objective is not
    below the base's (less ``1e-12 (1 + |objective|)``; with ``armijo > 0``, Armijo's
    sufficient increase) or it is the step's last trial, as
    :func:`fedstats.contract.newton.damped_newton` accepts it. So every point lies on a
    Newton segment from a base, and every base's objective is at least its predecessor's
    unless a whole step's trials failed.

    ``evaluation``: ``"sums"`` (the replies hold ``loglik``, ``gradient`` and ``hessian``),
    ``"cox-grid"`` (the replies hold a pooled Cox model's grid sums; the partial likelihood
    is :func:`fedstats.cox_math.grid_partial_likelihood` of their total, with the request's
    ``ties``), ``"fine-gray"`` (the same from a Fine–Gray fit's
    :class:`fedstats.cox_math.GridSums`, Efron's ties unless the request says otherwise) or
    ``"tpr-parity"`` (the logistic likelihood's sums and the groups' smooth true-positive
    sums; the objective is :func:`fedstats.contract.fairness.penalised` with the request's
    ``gamma``). A request's ``ridge`` (default 0) penalises the objective by
    ``ridge / 2 ||beta||^2``. ``restart``: ``"rates"`` lets round 2 start a Poisson fit at
    the intercept-only rates derived from round 1 (:func:`rate_start`), a base of its own.
    ``prelude``: ``"censoring"`` (Fine–Gray): round 1 asks at the start with every
    ``censoring`` weight 1, and round 2, again at the start, with the censoring curve
    derived from round 1's counts (:func:`fedstats.contract.fine_gray.censoring_from_counts`);
    the Newton path runs from round 2. ``warm_start``: the one request argument (e.g.
    ``"gamma"``) whose value may differ from a path the site verified earlier, whose points
    round 1 may then start at (a series of fits along a penalty, each from the last one's
    end, :func:`warm_start_digest`)."""

    damped: bool = True
    evaluation: str = "sums"
    restart: str | None = None
    max_trials: int = MAX_HALVINGS
    armijo: float = 0.0
    warm_start: str | None = None
    prelude: str | None = None

    def fields(self, p: int, args: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
        if self.evaluation in ("cox-grid", "fine-gray"):
            return {"x_events": (p,)}  # the grid's length is the request's; shapes follow
        if self.evaluation == "tpr-parity":
            levels = (args or {}).get("levels")
            G = len(levels) if isinstance(levels, list) else -1
            return {"loglik": (), "score": (p,), "information": (p, p), "positives": (G,),
                    "soft": (G,), "gradient": (G, p)}  # fmt: skip
        return {"gradient": (p,), "hessian": (p, p), "loglik": ()}

    def summed_fields(self) -> tuple[str, ...]:
        """The reply fields :meth:`evaluate` sums (and :func:`rate_start` reads)."""
        if self.evaluation == "cox-grid":
            return GRID_FIELDS
        if self.evaluation == "fine-gray":
            return FINE_GRAY_FIELDS
        if self.evaluation == "tpr-parity":
            return PARITY_FIELDS
        return ("loglik", "gradient", "hessian")

    def total(self, replies: Replies) -> ReplyTotal:
        """The replies as their total (:class:`ReplyTotal`), which every method of the rule
        reads as it reads the replies; ``KeyError``, ``ValueError`` or ``TypeError`` when a
        field the rule sums is missing or does not add up."""
        return ReplyTotal({name: summed(replies, name) for name in self.summed_fields()})

    def evaluate(
        self, replies: Replies, beta: np.ndarray, args: Mapping[str, Any]
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """``(objective, score, information)`` at ``beta`` from the summed replies (kept with a
        :class:`ReplyTotal`, by the point and the request's digest, so each is derived once)."""
        if not isinstance(replies, ReplyTotal):
            return self._evaluate(replies, beta, args)
        key = (point_digest(beta), request_digest(args))
        found = replies.evaluations.get(key)
        if found is None:
            found = replies.evaluations[key] = self._evaluate(replies, beta, args)
        return found

    def _evaluate(
        self, replies: Replies, beta: np.ndarray, args: Mapping[str, Any]
    ) -> tuple[float, np.ndarray, np.ndarray]:
        if self.evaluation in ("cox-grid", "fine-gray"):
            if self.evaluation == "cox-grid":
                sums: GridSums = WeightedGridSums(**{f: summed(replies, f) for f in GRID_FIELDS})
                ties = str(args.get("ties", "breslow"))
            else:
                sums = GridSums(**{f: summed(replies, f) for f in FINE_GRAY_FIELDS})
                ties = str(args.get("ties", "efron"))
            found = grid_partial_likelihood(sums, beta, ties)
            loglik, score, information = found.loglik, found.score, found.information
        elif self.evaluation == "tpr-parity":
            total = {name: summed(replies, name) for name in PARITY_FIELDS}
            gamma = penalty_weight(args)
            if not np.isfinite(gamma):
                raise ValueError("the request's gamma is not a number >= 0")
            found = penalised(total, gamma)
            loglik, score, information = found.objective, found.descent, found.curvature
        else:
            loglik = float(summed(replies, "loglik"))
            score, information = summed(replies, "gradient"), summed(replies, "hessian")
        ridge = ridge_of(args)
        return (
            loglik - ridge / 2 * float(beta @ beta),
            score - ridge * beta,
            information + ridge * np.eye(len(beta)),
        )

    def accepts(
        self,
        trial: tuple[Replies, np.ndarray],
        base: tuple[Replies, np.ndarray],
        args: Mapping[str, Any],
        halving: int,
    ) -> bool:
        """Whether a trial, ``base + step / 2^halving``, becomes the next base: its objective
        did not fall (:meth:`improves`), or it is the last trial of the step (the fit keeps the
        point it evaluated, :func:`fedstats.contract.newton.damped_newton`)."""
        if halving == self.max_trials - 1:
            return True
        after = self.evaluate(trial[0], trial[1], args)[0]
        before, score, information = self.evaluate(base[0], base[1], args)
        return self.improves(after, before, score, information, halving)

    def improves(
        self,
        after: float,
        before: float,
        score: np.ndarray,
        information: np.ndarray,
        halving: int,
    ) -> bool:
        """The acceptance test of a trial's objective against its base's: not below it (less
        ``1e-12 (1 + |objective|)``), or with ``armijo > 0`` the sufficient increase
        ``after >= before + armijo 2^-halving g' H^-1 g`` (Armijo 1966; Nocedal & Wright 2006,
        §3.1)."""
        if self.armijo > 0:
            step = newton_step(information, score, [], first=False)
            if step is None:
                return False
            return after >= before + self.armijo * 2.0**-halving * float(score @ step)
        return after >= before - 1e-12 * (1 + abs(before))

    def halving(
        self, requested: np.ndarray, base: np.ndarray, replies: Replies, args: Mapping[str, Any]
    ) -> int | None:
        """The ``j`` for which ``requested`` is ``base + step / 2^j``, ``j < max_trials``
        (within the tolerance, in standard errors), or ``None``."""
        found = self.step(replies, base, args)
        if found is None:
            return None
        step, information = found
        for j in range(self.max_trials):
            if deviation(requested, base + step / 2**j, information) <= TOLERANCE:
                return j
        return None

    def on_segment(
        self, requested: np.ndarray, base: np.ndarray, replies: Replies, args: Mapping[str, Any]
    ) -> bool:
        """Whether ``requested`` is a trial of the step from ``base`` (:meth:`halving`)."""
        return self.halving(requested, base, replies, args) is not None


MAX_SERVER_LR = 10.0
"""The largest server learning rate an exact training path may step with (FedAvg's is 1): a
coordinator choosing it huge would scale the honest updates into a network of its own."""


@dataclass(frozen=True)
class FedAvgPath(NewtonPath):
    """Exact rounds of federated averaging (McMahan et al., AISTATS 2017; FedProx, Li et al.,
    MLSys 2020; SCAFFOLD, Karimireddy et al., ICML 2020) with every site taking part: the
    point is the global network's flat float32 weights, SCAFFOLD's server control variate
    appended. Round 1 is the network drawn from the request's ``init_seed``
    (:attr:`seeded_start`); round ``t`` is ``x + eta_s sum_k (n_k / N) Delta_k`` (the
    request's ``server_lr``, FedAvg's server step) and ``c + sum_k Delta c_k / K``, from the
    round ``t - 1`` updates of all ``K`` sites, each weighted by the rows ``n_k`` its reply
    says it trained on (under DP-SGD: the noisy count it released when the design was
    agreed), ``0 < eta_s <=`` :data:`MAX_SERVER_LR`. A request naming a rule of
    :mod:`fedstats.contract.aggregation` (its ``aggregator``: coordinate-wise median,
    trimmed mean, norm bounding) combines the updates by that rule instead. Adaptive server
    optimisers (FedAdam, FedYogi) carry state no site re-derives: no point follows under
    them."""

    seeded_start: bool = True
    private_rounds: bool = True

    def sums_replies(self, args: Mapping[str, Any]) -> bool:
        """Only when every site weighs its own update by its rows (``scale`` is
        :data:`SELF_WEIGHTED`) and FedAvg's mean combines them: the step is then
        ``sum_k n_k Delta_k / sum_k n_k``, two sums."""
        return args.get("scale") == SELF_WEIGHTED and RULE_KEY not in args

    def point(self, args: Mapping[str, Any]) -> Any:
        weights, control = args.get("weights"), args.get("control")
        if not (isinstance(weights, list) and weights) or not all(
            isinstance(w, np.ndarray) for w in weights
        ):
            return None
        parts = [np.asarray(w).ravel() for w in weights]
        if control is not None:
            if not isinstance(control, np.ndarray):
                return None
            parts.append(np.asarray(control).ravel())
        try:
            return np.concatenate(parts).astype(np.float64)
        except (ValueError, TypeError):
            return None

    def fields(self, p: int, args: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
        return {"n_obs": ()}  # the update's shape and coding are checked when it is decoded

    def next_point(
        self, beta: np.ndarray, replies: Replies, args: Mapping[str, Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        args = args or {}
        scaffold = args.get("algorithm") == "scaffold"
        lr = args.get("server_lr")
        if args.get("server_optimizer") is not None or not (
            isinstance(lr, int | float)
            and not isinstance(lr, bool)
            and 0 < lr <= MAX_SERVER_LR  # not nan either
        ):
            return None
        n_params = len(beta) // 2 if scaffold else len(beta)
        sites = sorted(replies)
        counts = np.array([float(replies[s]["n_obs"]) for s in sites])
        if not (np.isfinite(counts).all() and (counts > 0).all()):
            return None
        if args.get("scale") == SELF_WEIGHTED:  # sum_k n_k Delta_k / sum_k n_k
            update = summed(replies, "update") / counts.sum()
            if update.shape != (n_params,):
                return None
        elif RULE_KEY in args:  # a rule of the contract: the robust ones ignore the rows
            try:
                rule = aggregation_rule(args[RULE_KEY])
                update = rule([_update_of(replies[s], n_params, args) for s in sites], counts)
            except (ValueError, StudyConfigurationError):
                return None
        else:
            weights = counts / counts.sum()
            update = np.zeros(n_params)
            for site, weight in zip(sites, weights, strict=True):
                update += float(weight) * _update_of(replies[site], n_params, args)
        derived = [(beta[:n_params].astype(np.float32) + lr * update).astype(np.float32)]
        if scaffold:
            step = sum(np.asarray(replies[s]["control_update"], dtype=np.float64) for s in sites)
            if args.get("scale") == SELF_WEIGHTED:  # each site sent Delta c_k / K
                path = args.get(PATH_KEY)
                k = len(path.get("sites", [])) if isinstance(path, dict) else 0
                if k < 1 or args.get("control_scale") != 1.0 / k:
                    return None
            else:
                step = step / len(sites)
            derived.append((beta[n_params:].astype(np.float32) + step).astype(np.float32))
        return np.concatenate(derived).astype(np.float64), None

    def close(
        self, requested: np.ndarray, derived: np.ndarray, information: np.ndarray | None
    ) -> bool:
        """Equal to float32 rounding: every entry within ``1e-6`` of the largest weight's
        size (at least 1), whatever order the sites' updates were summed in."""
        if requested.shape != derived.shape or not np.isfinite(requested).all():
            return False
        scale = max(1.0, float(np.max(np.abs(derived), initial=0.0)))
        return bool(np.max(np.abs(requested - derived), initial=0.0) <= 1e-6 * scale)


def _update_of(reply: Mapping[str, Any], n_params: int, args: Mapping[str, Any]) -> np.ndarray:
    """A site's flat update, decoded when it was quantised (the request's ``quantize_bits``)."""
    bits = args.get("quantize_bits")
    if bits is None:
        update = np.asarray(reply["update"], dtype=np.float64)
    else:
        coded = Quantized.from_wire({"packed": reply["update_packed"],
                                     "scale": reply["update_scale"], "bits": bits,
                                     "length": n_params})  # fmt: skip
        update = dequantize(coded)
    if update.shape != (n_params,):
        raise ValueError("an update of another size than the network")
    return update


SELF_WEIGHTED = "rows"
"""A training round's ``scale`` when each site weighs its own update by its rows ``n_k``
(and sends ``n_k``): inside secure aggregation the coordinator then learns
``sum_k n_k Delta_k`` and ``sum_k n_k`` and divides, and no weight of its choosing can single a
site's update out of the sum."""


GRID_FIELDS = tuple(WeightedGridSums.__dataclass_fields__)
"""The fields of a pooled Cox model's grid sums (:class:`fedstats.cox_math.WeightedGridSums`)."""

FINE_GRAY_FIELDS = tuple(GridSums.__dataclass_fields__)
"""The fields of a Fine–Gray fit's weighted grid sums (:class:`fedstats.cox_math.GridSums`)."""


def ridge_of(args: Mapping[str, Any]) -> float:
    """A request's ridge penalty: a finite number >= 0 (0 when absent), else ``nan``."""
    ridge = args.get("ridge", 0.0)
    if isinstance(ridge, bool) or not isinstance(ridge, int | float):
        return float("nan")
    ridge = float(ridge)
    return ridge if np.isfinite(ridge) and ridge >= 0 else float("nan")


def rate_start(
    names: Sequence[str], start: np.ndarray, replies: Mapping[str, Mapping[str, Any]]
) -> np.ndarray:
    """A Poisson fit's start at the intercept-only rates: for each intercept column ``j``
    (``Intercept`` or a site's own, 0/1), ``beta_j = log(sum y / sum mu_0)`` over its rows,
    from the first round's score ``g_j = sum y - sum mu_0`` and information
    ``H_jj = sum mu_0``. Unchanged where a column has no events or no exposure."""
    score, information = summed(replies, "gradient"), summed(replies, "hessian")
    out = np.array(start, dtype=np.float64)
    for j, name in enumerate(names):
        if name == "Intercept" or is_site_column(name):
            expected = float(information[j, j])
            observed = float(score[j]) + expected
            if expected > 0 and observed > 0:
                out[j] = np.log(observed / expected)
    return out


SITE_COLUMN = "site[{}]"
"""The name of a site's own intercept column (``site_intercepts=True``)."""


def is_site_column(name: str) -> bool:
    prefix, _, _ = SITE_COLUMN.partition("{}")
    return name.startswith(prefix) and name.endswith("]")


TOTAL_KEY = "total of the relayed replies"
"""The one entry of a :class:`ReplyTotal`."""


class ReplyTotal(Mapping[str, Mapping[str, Any]]):
    """Every site's reply at one point as their total: one entry (:data:`TOTAL_KEY`) holding
    the :func:`summed` value of each field, which :func:`summed` reads back unchanged
    (``0 + total``), so every rule that reads replies through :func:`summed` derives the
    same numbers from it as from the replies. A :class:`DampedNewtonPath` keeps its
    evaluations with it (:attr:`evaluations`, by point and request arguments): a site
    checking a halving, an acceptance and a step from one point derives that point's
    objective, score and information once, and once only if it keeps the total for the next
    request (:attr:`PathRequest.accepted_kept`)."""

    def __init__(self, total: Mapping[str, Any]) -> None:
        self._entry = {TOTAL_KEY: dict(total)}
        self.evaluations: dict[tuple[str, str], tuple[float, np.ndarray, np.ndarray]] = {}

    def __getitem__(self, site: str) -> Mapping[str, Any]:
        return self._entry[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entry)

    def __len__(self) -> int:
        return 1

    @property
    def fields(self) -> dict[str, Any]:
        """The total of each field."""
        return self._entry[TOTAL_KEY]


def summed(replies: Mapping[str, Mapping[str, Any]], field: str) -> np.ndarray:
    """The sum of one field over the replies, in the sites' sorted order (every side sums
    alike): ``((0 + r_1) + r_2) + ...``, arrays of one shape added in place."""
    values = [np.asarray(replies[site][field], dtype=np.float64) for site in sorted(replies)]
    if not values or values[0].ndim == 0 or any(v.shape != values[0].shape for v in values):
        return sum(values)
    total = 0 + values[0]
    for value in values[1:]:
        total += value
    return total


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


def point_digest(beta: np.ndarray) -> str:
    return digest(np.ascontiguousarray(beta, dtype="<f8").tobytes())


def design_digest(design: Any) -> str:
    """The digest of a request's ``design`` as the codec writes it (what a fitted model's
    evaluations are matched on)."""
    return digest(codec.encode(design))


DP_KEY, DP_NOTE = "dp", "note"
"""A private request's block (:class:`fedstats.contract.dp_request.DpRequest`) and its note."""

POINT_ARGUMENTS = ("beta", "weights", "control", "seed", PATH_KEY)
"""The request arguments that change from round to round of one path: the point (``beta``; a
network's ``weights`` and SCAFFOLD's ``control`` variate), a training round's batch-order
``seed``, and the path itself."""


SECURE_BLOCK = "secagg"
"""A masked request's secure-aggregation block (its session's sealed shares): new every round,
so not part of what a path's replies are bound to; a masked reply signs its session itself
(:data:`fedstats.contract.secure_aggregation.MASK_FACTS`)."""


def request_digest(args: Mapping[str, Any]) -> str:
    """The digest of a request's arguments but those of :data:`POINT_ARGUMENTS` and its
    secure-aggregation block, as the codec writes them: the design, family, ties, grid,
    penalty, network, privacy mechanism... every reply of a path is bound to. A private
    request's ledger note (``dp.note``, e.g. "DP-SGD round 3") names the round for the
    site's ledger and changes nothing computed: it is left out, as the round's point is."""
    dropped = (*POINT_ARGUMENTS, SECURE_BLOCK)
    bound = {k: v for k, v in args.items() if k not in dropped}
    dp = bound.get(DP_KEY)
    if isinstance(dp, Mapping) and DP_NOTE in dp:
        bound[DP_KEY] = {k: v for k, v in dp.items() if k != DP_NOTE}
    return digest(codec.encode(bound))


def warm_start_digest(args: Mapping[str, Any], argument: str) -> str:
    """The digest of a request's arguments but its point, path and ``argument``: the paths a
    warm start may cross between share it."""
    return request_digest({k: v for k, v in args.items() if k != argument})


def reply_digest(reply: Mapping[str, Any]) -> str:
    """SHA-256 of a reply's canonical bytes: each field in sorted order as its name, a type tag
    and its value (a number as little-endian float64 or int64, a flag as one byte, text as
    UTF-8, an array as its dtype, shape and C-order bytes; an integer outside int64, which no
    honest reply holds, as its decimal text), every part length-prefixed, so two
    replies share a digest only when every field is equal in type and value. Nested values
    (never in a path task's reply) are hashed through the codec."""
    hasher = hashlib.sha256()
    for name in sorted(reply):
        value = reply[name]
        tagged: tuple[bytes | np.ndarray, ...]
        if isinstance(value, bool | np.bool_):
            tagged = (b"b" + bytes([bool(value)]),)
        elif isinstance(value, int | np.integer):
            number = int(value)
            if -(2**63) <= number < 2**63:
                tagged = (b"i" + number.to_bytes(8, "little", signed=True),)
            else:
                tagged = (b"I" + str(number).encode(),)
        elif isinstance(value, float | np.floating):
            tagged = (b"f" + np.float64(value).tobytes(),)
        elif isinstance(value, str):
            tagged = (b"s" + value.encode(),)
        elif isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            tagged = (
                b"a" + array.dtype.str.encode() + repr(array.shape).encode(),
                array.reshape(-1).view(np.uint8),
            )  # its C-order bytes, not copied
        else:
            tagged = (b"c" + codec.encode(value),)
        for data in (name.encode(), *tagged):  # each part length-prefixed, hashed in turn
            hasher.update(len(data).to_bytes(8, "little"))
            hasher.update(data)
    return hasher.hexdigest()


STATEMENT_KIND = "fedstats path reply v2"


def statements(
    *,
    task: str,
    request: str,
    sites: Sequence[str],
    round: int,
    beta: np.ndarray,
    base: np.ndarray,
) -> Callable[[Mapping[str, Any], bool], bytes]:
    """The bytes a site signs over its answer at one point of a path, for each site's reply
    there (``statements(...)(reply, verified)``): canonical JSON (sorted keys, no spaces) of
    the task, the request's digest (:func:`request_digest`), the fit's sites, the round, the
    digests of the point and its base (their float64 bytes) and of the reply
    (:func:`reply_digest`), and whether the site verified the point before answering. The
    point's parts are written once; the signing keys are the study's (its pinned roster),
    which ties the statement to it."""
    dumps = partial(json.dumps, sort_keys=True, separators=(",", ":"))
    head = dumps({"base": point_digest(base), "beta": point_digest(beta),
                  "kind": STATEMENT_KIND})  # fmt: skip
    tail = dumps({"request": request, "round": int(round), "sites": sorted(sites),
                  "task": task})  # fmt: skip
    before, after = head[:-1] + ',"reply":"', '",' + tail[1:-1] + ',"verified":'

    def at_point(reply: Mapping[str, Any], verified: bool) -> bytes:
        flag = "true" if verified else "false"
        return (before + reply_digest(reply) + after + flag + "}").encode()

    return at_point


KEPT_KEY = "kept"
"""Marks a relayed point sent without its replies (:meth:`Evaluated.to_wire`)."""


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
class Evaluated:
    """A point of a path every site answered: the point, its round, its base (the accepted
    point it was stepped from; itself for a base), and each site's signed reply there."""

    beta: np.ndarray
    round: int
    base: np.ndarray
    replies: Mapping[str, SignedReply]
    seeds: Mapping[str, str] | None = None
    """Inside secure aggregation: each site's self-mask seed (hex), rebuilt by the coordinator
    when it unmasked the round, relayed beside the signed masked replies."""

    @property
    def is_base(self) -> bool:
        return bool(np.array_equal(self.beta, self.base))

    def to_wire(self, *, kept: bool = False) -> dict[str, Any]:
        """The wire form; a base is sent only when it is not the point itself. ``kept``: the
        point alone, marked ``"kept": true``, for sites that verified its replies in the
        fit's last request and keep their total (:attr:`PathRequest.accepted_kept`)."""
        wire: dict[str, Any] = {"beta": self.beta, "round": self.round}
        if not self.is_base:
            wire["base"] = self.base
        if kept:
            wire[KEPT_KEY] = True
            return wire
        wire["replies"] = {s: r.to_wire() for s, r in sorted(self.replies.items())}
        if self.seeds is not None:
            wire["seeds"] = dict(sorted(self.seeds.items()))
        return wire


@dataclass(frozen=True)
class PathRequest:
    """Where a request stands on its fit's path: the sites whose sums make the path, the
    round, the point's base, and (after round 1) the previous point with every site's signed
    reply there and, when that point was a trial, the base it was tried from."""

    sites: tuple[str, ...]
    round: int
    base: np.ndarray | None
    previous: Evaluated | None = None
    accepted: Evaluated | None = None
    accepted_kept: bool = False
    """Whether ``accepted`` goes without its replies: the fit's last request relayed them in
    full, and a site that verified that request keeps their total (by the point, its round
    and base, the request and the sites), so each point's replies cross the wire once."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"sites": list(self.sites), "round": self.round}
        if self.base is not None:  # None: the base is the point itself
            wire["base"] = self.base
        if self.previous is not None:
            wire["previous"] = self.previous.to_wire()
        if self.accepted is not None:
            wire["accepted"] = self.accepted.to_wire(kept=self.accepted_kept)
        return wire
