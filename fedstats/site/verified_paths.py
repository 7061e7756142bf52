"""A site's half of the path rules: answer an exact fit only at points it re-derived itself.

The rule of each task (:data:`fedstats.contract.path_rules.PATH_RULES`)
says where its fit starts and how it steps. Before any row is read, a request
of such a task carries its ``path``: the fit's sites, the round, the point's
base (the accepted point it steps from), the last point every site answered
with each site's signed reply there and, when that point was a trial, the
base it was tried from with its replies. The site checks each signature with
the key its roster pins for that site, sums the replies, re-derives the step
with the contract's own code, and refuses (rule ``path``) a point further
than :data:`~fedstats.contract.paths.TOLERANCE` standard errors from every
step the rule allows (for plain Newton, one; with step halving, the halvings
of a base's step, a trial becoming a base only if its objective did not
fall). Its own reply is then signed over the point and its base
(:func:`signature`), so the next round can be checked by every site in turn:
every point it answers lies on a path an honest fit of these sites' data can
take.

Switched on per site (``Silo(verified_paths=True)``, which needs the pinned
roster and signing key of :class:`~fedstats.secagg.roster.RosterPin`); a site with a
pinned key that does not verify still signs its replies, so a fit can cross sites of
both kinds (each verifying site checks its own signature at the previous point).

Inside secure aggregation (Bonawitz et al., CCS 2017) a site signs its masked reply ``y_u``
with the session and a commitment to its self-mask seed ``b_u``
(:data:`fedstats.contract.secure_aggregation.MASK_FACTS`), and answers only when the
session's sites are the path's (each masks against all its graph neighbours in the session),
so the pairwise masks cancel in the total. The next
round relays the signed masked replies with the seeds the coordinator rebuilt when it
unmasked; the site checks each seed against its commitment and recomputes the total
``sum_u y_u - sum_u PRG(b_u)`` (:func:`fedstats.contract.secure_aggregation.unmasked_total`),
which is what the coordinator stepped from. The relay shows a site nothing the coordinator
did not see (``y_u`` and ``b_u`` still hide ``x_u`` behind the pairwise masks). A training
round is re-derived from the sum only when each site weighs its own update by its rows
(:data:`fedstats.contract.paths.SELF_WEIGHTED`); weights of the coordinator's choosing are
refused inside secure aggregation. Private requests are answered off any path (their noise
is charged, whatever the point), and so are tasks without a rule, except a record-level
private training round that carries a path: it is verified like an exact one (each site's
DP-SGD update is noised at the site, so the next network is as determined by the signed
replies), which lets its network be evaluated where it is verified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract.fine_gray import COUNT_FIELDS, censoring_from_counts, convention_of
from fedstats.contract.path_rules import (
    PATH_RULES,
    RELAYED_EVALUATIONS,
    STEPPED_EVALUATIONS,
    TRAINED_EVALUATIONS,
    TRAINED_INPUTS,
    TRAINING_KEY,
)
from fedstats.contract.paths import (
    CLIENT_LEVEL_KEY,
    FIT_KEY,
    KEPT_KEY,
    MAX_ROUND,
    PATH_KEY,
    TOLERANCE,
    DampedNewtonPath,
    NewtonPath,
    ReplyTotal,
    design_digest,
    point_digest,
    rate_start,
    request_digest,
    statements,
    summed,
    warm_start_digest,
)
from fedstats.contract.secure_aggregation import (
    MASK_FACTS,
    MASKED_FIELD,
    masked_length,
    seed_commitment,
    unflatten,
    unmasked_total,
)
from fedstats.errors import DisclosureError, MalformedRequestError, StudyConfigurationError
from fedstats.schema import ReplySchema
from fedstats.secagg import ring, shamir
from fedstats.site.task import SiteContext

EVALUATION_TASKS = frozenset({"cox.robust", "cox.concordance"})
"""Tasks that evaluate a fitted model at its coefficients: at a site that verifies paths,
answered only at a point the site answered on a verified path of the same design (a Cox
fit ends at its last accepted point, which every site answered)."""


def is_evaluation(task: str, args: dict[str, Any]) -> bool:
    """Whether a request evaluates a fitted model (:data:`EVALUATION_TASKS`, or a fair fit's
    AUC pair counts, ``fairness.summaries`` with ``auc``)."""
    return task in EVALUATION_TASKS or (task == "fairness.summaries" and args.get("auc") is True)


def audited(task: str, args: dict[str, Any]) -> bool:
    """Whether an exact answer to this request is one a site's audit re-derives: an
    evaluation of a fitted model (:func:`is_evaluation`, or one with the fit's last point
    relayed); answers on a path say so themselves (their replies are signed)."""
    if args.get("dp") is not None:
        return False
    return (
        is_evaluation(task, args)
        or task in RELAYED_EVALUATIONS
        or task in TRAINED_EVALUATIONS
        or task in STEPPED_EVALUATIONS
    )


REMEMBERED_POINTS = 100_000
"""The most verified points a site remembers for evaluations (the oldest are forgotten:
an evaluation there is then refused, never answered)."""

MAX_SIGNATURE_CHARS = 200
"""Longest hex signature accepted (Ed25519: 128; DER ECDSA P-256: at most 144)."""


@dataclass(frozen=True)
class PathPoint:
    """A verified point: what the site's signature over its reply there covers."""

    task: str
    request: str
    sites: tuple[str, ...]
    round: int
    beta: np.ndarray
    base: np.ndarray

    def statement(self, reply: dict[str, Any], verified: bool) -> bytes:
        """The bytes a site signs over its ``reply`` at this point
        (:func:`fedstats.contract.paths.statements`)."""
        at_point = statements(task=self.task, request=self.request, sites=self.sites,
                              round=self.round, beta=self.beta, base=self.base)  # fmt: skip
        return at_point(reply, verified)


def verified_point(
    ctx: SiteContext,
    task: str,
    args: dict[str, Any],
    *,
    secure: bool,
) -> PathPoint | None:
    """The request's point once verified (``None`` when no path rule applies to it).

    Raises :class:`~fedstats.errors.DisclosureError` (rule ``path``) for a request without a
    well-formed path, a relayed reply that is missing, unsigned or signed by another key, or
    a point the relayed replies do not lead to. Reads no row.
    """
    rule = PATH_RULES.get(task)
    pin = ctx.secure_aggregation
    if pin is None or (args.get("dp") is not None and not _private_on_path(rule, args)):
        return None
    if secure:
        if not ctx.verified_paths:
            return None
        if rule is not None and not rule.sums_replies(args):
            raise _refused(
                ctx,
                task,
                "an exact training round inside secure aggregation is re-derived from the sum "
                "of masked updates only when each site weighs its own update by its rows "
                "(scale 'rows') under FedAvg's mean: this site does not answer one weighed by "
                "the coordinator",
            )
    if ctx.trusts_client_level and (
        args.get("clip") is not None or args.get(CLIENT_LEVEL_KEY) is True
    ):
        return None  # a client-level private fit, at a site that trusts the coordinator
    if ctx.verified_paths and task in RELAYED_EVALUATIONS:
        _check_relayed_evaluation(ctx, task, args, pin)
        return None
    if ctx.verified_paths and task in TRAINED_EVALUATIONS:
        _check_trained_evaluation(ctx, task, args, pin)
        return None
    if ctx.verified_paths and task in STEPPED_EVALUATIONS:
        _check_stepped_evaluation(ctx, task, args, pin)
        return None
    if ctx.verified_paths and is_evaluation(task, args):
        if PATH_KEY in args:  # the fit's last point, relayed (held-out sites keep no points)
            _check_evidenced_evaluation(ctx, task, args, pin)
        else:
            _check_evaluated_point(ctx, task, args)
        return None
    if rule is None:
        return None
    path = args.get(PATH_KEY)
    if not ctx.verified_paths:
        return _unverified(task, args, path)
    if not isinstance(path, dict):
        raise _refused(ctx, task, "an exact request of this fit must carry its path")
    beta = _point(ctx, task, rule.point(args), None, "the path's point")
    base = (
        beta
        if "base" not in path  # a base of its own
        else _point(ctx, task, path.get("base"), beta.shape, "the point's base")
    )
    sites = _sites(ctx, task, path.get("sites"), pin)
    round_ = path.get("round")
    if type(round_) is not int or not 1 <= round_ <= MAX_ROUND:
        raise _refused(ctx, task, f"the path's round must be an integer from 1 to {MAX_ROUND}")
    point = PathPoint(task, request_digest(args), sites, round_, beta, base)
    if round_ == 1:
        if set(path) - {"base"} != {"sites", "round"} or not (
            np.array_equal(base, beta)
            and (
                rule.seeded_start  # the site's deep task rebuilds the seeded network first
                or np.array_equal(beta, rule.start(len(beta)))
                or _warm(ctx, task, rule, args)
            )
        ):
            raise _refused(
                ctx,
                task,
                "round 1 of the path starts at the rule's start point"
                + (
                    " or at a point of a verified path that differs only in its "
                    f"{rule.warm_start!r}"
                    if isinstance(rule, DampedNewtonPath) and rule.warm_start
                    else ""
                ),
            )
        if _prelude(rule) and not _all_ones(args.get("censoring")):
            raise _refused(ctx, task, "round 1 of a Fine-Gray path weighs every patient 1")
        return point
    if not set(path) <= {"sites", "round", "base", "previous", "accepted"} or (
        "previous" not in path
    ):
        raise _refused(ctx, task, "a later round carries the previous point and its replies")
    if _prelude(rule) and round_ == 2:
        return _after_prelude(ctx, task, args, path, point, pin)
    layout = _layout(ctx, task, args)
    previous = _evaluated(ctx, task, path["previous"], point, pin, layout=layout)
    if _prelude(rule) and previous["round"] < 2:
        raise _refused(ctx, task, "a Fine-Gray path's Newton rounds follow its second round")
    accepted = None
    if not np.array_equal(previous["beta"], previous["base"]):  # the previous was a trial
        if "accepted" not in path:
            raise _refused(ctx, task, "a trial's base must come with its replies")
        wire = path["accepted"]
        accepted = (
            _kept_point(ctx, task, wire, point, rule)
            if isinstance(wire, dict) and KEPT_KEY in wire
            else _evaluated(ctx, task, wire, point, pin, layout=layout)
        )
        if not np.array_equal(accepted["beta"], previous["base"]):
            raise _refused(ctx, task, "the relayed base is not the previous point's base")
    elif "accepted" in path:
        raise _refused(ctx, task, "the previous point is a base: no other base is relayed")
    relayed_base = accepted is not None
    previous, accepted = (_summed(rule, e, len(point.beta), args) for e in (previous, accepted))
    if (
        previous is None
        or (relayed_base and accepted is None)  # the base's replies do not fit or add up
        or not _follows(rule, point, previous, accepted, args)
    ):
        raise _refused(
            ctx,
            task,
            "the coefficients are not a next point of the path (more than "
            f"{TOLERANCE:g} standard errors from every step the relayed replies allow)",
        )
    _keep_totals(ctx, point, previous, accepted)
    return point


def _summed(
    rule: NewtonPath, evaluated: dict[str, Any] | None, p: int, args: dict[str, Any]
) -> dict[str, Any] | None:
    """A relayed point whose replies hold the fields the rule reads, each of its shape, with
    a damped rule's replies as their total (:meth:`DampedNewtonPath.total`: each point's
    replies summed once, and kept by :func:`_keep_totals`); ``None`` when they do not fit or
    do not add up (and for no point)."""
    if evaluated is None:
        return None
    replies = evaluated["replies"]
    if isinstance(replies, ReplyTotal):  # a kept total, checked when it was relayed
        return evaluated
    if not all(_sums_fit(rule, reply, p, args) for reply in replies.values()):
        return None
    if not isinstance(rule, DampedNewtonPath):
        return evaluated
    try:
        with np.errstate(all="ignore"):
            return {**evaluated, "replies": rule.total(replies)}
    except (ValueError, IndexError, KeyError, TypeError):
        return None


def _follows(
    rule: NewtonPath,
    point: PathPoint,
    previous: dict[str, Any],
    accepted: dict[str, Any] | None,
    args: dict[str, Any],
) -> bool:
    """Whether ``point`` (with its declared base) is a step the rule allows after
    ``previous`` (and, when ``previous`` was a trial, its base ``accepted``), both
    :func:`_summed`; relayed sums that do not compute (a singular information) allow
    nothing."""
    try:
        with np.errstate(all="ignore"):
            return _allowed(rule, point, previous, accepted, args)
    except (ValueError, IndexError, KeyError, TypeError, np.linalg.LinAlgError):
        return False


def _allowed(
    rule: NewtonPath,
    point: PathPoint,
    previous: dict[str, Any],
    accepted: dict[str, Any] | None,
    args: dict[str, Any],
) -> bool:
    beta, base = point.beta, point.base
    if not rule.damped:  # plain Newton: each point its own base, one step from the previous
        derived = rule.next_point(previous["beta"], previous["replies"], args)
        return (
            derived is not None
            and np.array_equal(base, beta)
            and rule.close(beta, derived[0], derived[1])
        )
    assert isinstance(rule, DampedNewtonPath)
    if np.array_equal(base, beta):  # a new base of its own: only a restart from round 1
        columns = args["design"].get("columns") if isinstance(args.get("design"), dict) else None
        return (
            rule.restart == "rates"
            and previous["round"] == 1
            and isinstance(columns, list)
            and len(columns) == len(beta)
            and bool(
                np.array_equal(beta, rate_start(columns, previous["beta"], previous["replies"]))
            )
        )
    if np.array_equal(base, previous["beta"]):  # the previous point is accepted as the base
        if accepted is not None:
            halving = rule.halving(previous["beta"], accepted["beta"], accepted["replies"], args)
            if halving is None or not rule.accepts(
                (previous["replies"], previous["beta"]),
                (accepted["replies"], accepted["beta"]),
                args,
                halving,
            ):
                return False
        return rule.on_segment(beta, base, previous["replies"], args)
    if accepted is not None and np.array_equal(base, accepted["beta"]):  # a shorter trial
        return rule.on_segment(beta, base, accepted["replies"], args)
    return False


def _private_on_path(rule: NewtonPath | None, args: dict[str, Any]) -> bool:
    """A record-level private round that carries a path, of a rule that verifies such rounds
    (:attr:`~fedstats.contract.paths.NewtonPath.private_rounds`; DP-FedAvg's client-level
    rounds carry the coordinator's noise and are never on a path)."""
    return (
        rule is not None
        and rule.private_rounds
        and PATH_KEY in args
        and args.get("clip") is None
        and args.get(CLIENT_LEVEL_KEY) is not True
    )


def _prelude(rule: NewtonPath) -> bool:
    return isinstance(rule, DampedNewtonPath) and rule.prelude == "censoring"


def _all_ones(values: Any) -> bool:
    return isinstance(values, np.ndarray) and values.ndim == 1 and bool(np.all(values == 1.0))


def _after_prelude(
    ctx: SiteContext,
    task: str,
    args: dict[str, Any],
    path: dict,
    point: PathPoint,
    pin: Any,
) -> PathPoint:
    """Round 2 of a Fine–Gray path: at the start again, with the censoring curve the relayed
    round-1 counts give (each reply signed over round 1's request, every weight 1)."""
    censoring = args.get("censoring")
    if set(path) - {"base"} != {"sites", "round", "previous"} or not (
        isinstance(censoring, np.ndarray) and censoring.ndim == 1
    ):
        raise _refused(ctx, task, "round 2 of a Fine-Gray path relays round 1's replies")
    ones = np.ones(len(censoring), dtype=np.float64)
    first = _evaluated(ctx, task, path["previous"], point, pin,
                       request=request_digest({**args, "censoring": ones}),
                       layout=_layout(ctx, task, args))  # fmt: skip
    start = np.zeros(len(point.beta))
    if not (
        first["round"] == 1
        and np.array_equal(first["beta"], start)
        and np.array_equal(point.beta, start)
        and np.array_equal(point.base, start)
    ):
        raise _refused(ctx, task, "round 2 of a Fine-Gray path asks at the start again")
    try:
        derived = censoring_from_counts(
            {f: summed(first["replies"], f) for f in COUNT_FIELDS}, convention_of(args)
        )
        agrees = derived.shape == censoring.shape and np.allclose(
            censoring, derived, rtol=1e-12, atol=0.0
        )
    except (KeyError, ValueError, TypeError):
        agrees = False
    if not agrees:
        raise _refused(
            ctx, task, "the censoring weights are not those the first round's counts give"
        )
    return point


def _relayed_last_point(
    ctx: SiteContext,
    task: str,
    path: Any,
    pin: Any,
    *,
    of: str,
    fit_args: dict[str, Any],
    beta: np.ndarray,
    extra: frozenset[str] = frozenset(),
    outsiders: bool = False,
) -> dict[str, Any]:
    """The fit's last point an evaluation relays (``path``: its sites, a round after the
    point's, the point with every site's signed reply there, and the ``extra`` keys): every
    signature checked over the fit's task ``of`` and arguments ``fit_args`` at ``beta``, with
    the key the roster pins. With ``outsiders`` a site that did not take part in the fit
    (held-out rows) may evaluate it, when every site of the fit says it verified the point."""
    if not (
        isinstance(path, dict) and set(path) - {"base"} == {"sites", "round", "previous"} | extra
    ):
        raise _refused(ctx, task, "an evaluation of a fit relays the fit's last point")
    sites = _sites(ctx, task, path.get("sites"), pin, member=not outsiders)
    round_ = path.get("round")
    if type(round_) is not int or not 2 <= round_ <= MAX_ROUND:
        raise _refused(ctx, task, "the evaluation's round must follow its fit's")
    relayed = path["previous"].get("replies") if isinstance(path["previous"], dict) else None
    if ctx.name not in sites and not (
        isinstance(relayed, dict)
        and all(isinstance(r, dict) and r.get("verified") is True for r in relayed.values())
    ):
        raise _refused(
            ctx, task, "a model fitted elsewhere is evaluated only when every site verified it"
        )
    point = PathPoint(of, request_digest(fit_args), sites, round_, beta, beta)
    layout = _layout(ctx, of, {**fit_args, "beta": beta})
    last = _evaluated(ctx, task, path["previous"], point, pin, layout=layout)
    if not np.array_equal(last["beta"], beta):
        raise _refused(ctx, task, "the evaluated point is not the fit's relayed last point")
    return last


def _check_relayed_evaluation(ctx: SiteContext, task: str, args: dict[str, Any], pin: Any) -> None:
    """An evaluation whose inputs derive from the sums at the fit's last point (the
    Fine–Gray robust variance's ``hazard`` and ``means``, and under ``cmprsk::crr``'s
    convention ``censoring_term`` and ``censoring_hazard``): the request relays that point
    (:func:`_relayed_last_point`), and the inputs must be those the summed replies give
    (:data:`fedstats.contract.path_rules.RELAYED_EVALUATIONS`)."""
    evaluation = RELAYED_EVALUATIONS[task]
    beta = _point(ctx, task, args.get("beta"), None, "the evaluated point")
    fit_args = {k: v for k, v in args.items() if k not in evaluation.derived}
    last = _relayed_last_point(
        ctx, task, args.get(PATH_KEY), pin, of=evaluation.of, fit_args=fit_args, beta=beta
    )
    try:
        total = {f: summed(last["replies"], f) for f in evaluation.fields(fit_args)}
        derived = evaluation.derive(total, fit_args)
        agrees = {name for name in evaluation.derived if name in args} == set(derived) and all(
            isinstance(args.get(name), np.ndarray)
            and args[name].shape == value.shape
            and np.allclose(args[name], value, rtol=1e-9, atol=1e-12 * _scale(value))
            for name, value in derived.items()
        )
    except (KeyError, ValueError, TypeError, IndexError):
        agrees = False
    if not agrees:
        raise _refused(
            ctx, task, f"{', '.join(evaluation.derived)} are not those the relayed sums give"
        )


def _scale(values: np.ndarray) -> float:
    """The largest magnitude of ``values`` (0 for none): a derived array's entries near 0 by
    cancellation are compared to it, as sites summing in another order differ in the last
    bits."""
    return float(np.max(np.abs(values), initial=0.0))


def _relayed_fit(
    ctx: SiteContext, task: str, args: dict[str, Any], of: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``path`` and ``fit`` an evaluation of a fitted model relays: the fit's task (``of``,
    or any task with a path rule) and its arguments, whose design must be the evaluated one
    (:func:`_same_inputs`)."""
    path = args.get(PATH_KEY)
    fit = path.get(FIT_KEY) if isinstance(path, dict) else None
    if not (
        isinstance(fit, dict)
        and set(fit) == {"task", "args"}
        and isinstance(fit["task"], str)
        and (fit["task"] == of if of is not None else fit["task"] in PATH_RULES)
        and isinstance(fit["args"], dict)
        and isinstance(path.get("previous"), dict)
    ):
        raise _refused(ctx, task, "an evaluation relays its fit's last point and the fit")
    _same_inputs(ctx, task, args, fit["args"], ("design",))
    return path, fit


def _same_inputs(
    ctx: SiteContext, task: str, args: dict[str, Any], fitted: dict[str, Any], names: tuple
) -> None:
    """Refuse an evaluation whose ``names`` arguments (design, scaling, network...) are not
    those of the fit or training it evaluates, compared as the codec writes them."""
    changed = [n for n in names if design_digest(args.get(n)) != design_digest(fitted.get(n))]
    if changed:
        raise _refused(
            ctx, task, f"the model is evaluated on other inputs than its fit's: {changed}"
        )


def _check_evidenced_evaluation(
    ctx: SiteContext, task: str, args: dict[str, Any], pin: Any
) -> None:
    """An evaluation of a fitted model at its last point, relayed with the fit's task and
    arguments (:func:`_relayed_last_point`; held-out sites of the study may ask too): the
    design evaluated must be the fit's."""
    path, fit = _relayed_fit(ctx, task, args)
    beta = _point(ctx, task, args.get("beta"), None, "the evaluated point")
    _relayed_last_point(ctx, task, path, pin, of=fit["task"], fit_args=fit["args"], beta=beta,
                        extra=frozenset({FIT_KEY}), outsiders=True)  # fmt: skip


def _check_stepped_evaluation(ctx: SiteContext, task: str, args: dict[str, Any], pin: Any) -> None:
    """An evaluation of a fitted model, on the fit's design, at the point the fit's relayed
    last round leads to by the fit's rule, or at that point itself (a fit that stopped there)
    (:data:`fedstats.contract.path_rules.STEPPED_EVALUATIONS`; held-out sites of the study may
    ask too: :func:`_relayed_last_point`)."""
    of = STEPPED_EVALUATIONS[task]
    path, fit = _relayed_fit(ctx, task, args, of)
    beta = _point(ctx, task, args.get("beta"), None, "the evaluated point")
    last_point = _point(ctx, task, path["previous"].get("beta"), beta.shape,
                        "the fit's last point")  # fmt: skip
    last = _relayed_last_point(ctx, task, path, pin, of=of, fit_args=fit["args"],
                               beta=last_point, extra=frozenset({FIT_KEY}),
                               outsiders=True)  # fmt: skip
    rule = PATH_RULES[of]
    try:
        derived = rule.next_point(
            last["beta"], last["replies"], {**fit["args"], "beta": last_point}
        )
        agrees = np.array_equal(beta, last["beta"]) or (
            derived is not None and rule.close(beta, derived[0], derived[1])
        )
    except (KeyError, ValueError, TypeError, IndexError, np.linalg.LinAlgError):
        agrees = False
    if not agrees:
        raise _refused(
            ctx, task, "the coefficients are not where the fit's relayed last round leads"
        )


def _check_trained_evaluation(ctx: SiteContext, task: str, args: dict[str, Any], pin: Any) -> None:
    """An evaluation of a trained network at the network the training path's last round
    leads to (:data:`fedstats.contract.path_rules.TRAINED_EVALUATIONS`), on the training's
    inputs (:data:`~fedstats.contract.path_rules.TRAINED_INPUTS`): that round is relayed with
    the training request (:func:`_relayed_last_point`), and the FedAvg step from its replies
    must give the weights evaluated."""
    training_task = TRAINED_EVALUATIONS[task]
    rule = PATH_RULES[training_task]
    path = args.get(PATH_KEY)
    training = path.get(TRAINING_KEY) if isinstance(path, dict) else None
    previous = path.get("previous") if isinstance(path, dict) else None
    if not (isinstance(training, dict) and isinstance(previous, dict)):
        raise _refused(
            ctx, task, "a trained network is evaluated only with its training's last round relayed"
        )
    _same_inputs(ctx, task, args, training, TRAINED_INPUTS)
    evaluated = _point(ctx, task, rule.point({"weights": args.get("weights")}), None,
                       "the evaluated network")  # fmt: skip
    last_point = _point(ctx, task, previous.get("beta"), None, "the training's last point")
    last = _relayed_last_point(ctx, task, path, pin, of=training_task, fit_args=training,
                               beta=last_point, extra=frozenset({TRAINING_KEY}),
                               outsiders=True)  # fmt: skip
    try:
        derived = rule.next_point(last["beta"], last["replies"], training)
        agrees = derived is not None and rule.close(
            evaluated, derived[0][: len(evaluated)], derived[1]
        )
    except (KeyError, ValueError, TypeError, IndexError):
        agrees = False
    if not agrees:
        raise _refused(
            ctx, task, "the network is not the one the relayed last round of training leads to"
        )


def _evaluated(
    ctx: SiteContext,
    task: str,
    wire: Any,
    point: PathPoint,
    pin: Any,
    request: str | None = None,
    layout: Callable[[], ReplySchema | None] | None = None,
) -> dict[str, Any]:
    """A relayed evaluated point (:class:`fedstats.contract.paths.Evaluated`), every reply
    checked against its site's pinned key (signed over ``request``, by default the point's
    own); this site's own reply must say it verified. Masked replies (relayed with their
    ``seeds``) become one reply, their total (:func:`_unmasked`), laid out by ``layout()``."""
    if not (
        isinstance(wire, dict) and set(wire) - {"base", "seeds"} == {"beta", "round", "replies"}
    ):
        raise _refused(ctx, task, "a relayed point is malformed")
    beta, at, base = _relayed_point(ctx, task, wire, point)
    replies = wire["replies"]
    if not isinstance(replies, dict) or sorted(replies) != list(point.sites):
        raise _refused(ctx, task, "the path needs the reply of every one of its sites")
    out = {}
    signed_at = statements(task=point.task,
                           request=point.request if request is None else request,
                           sites=point.sites, round=at, beta=beta, base=base)  # fmt: skip
    for site in point.sites:
        signed = replies[site]
        if not (
            isinstance(signed, dict)
            and set(signed) == {"reply", "signature", "verified"}
            and isinstance(signed["reply"], dict)
            and isinstance(signed["signature"], str)
            and len(signed["signature"]) <= MAX_SIGNATURE_CHARS
            and isinstance(signed["verified"], bool)
        ):
            raise _refused(ctx, task, f"the relayed reply of {site!r} is malformed")
        if site == ctx.name and not signed["verified"]:
            raise _refused(ctx, task, "this site did not verify a relayed point")
        message = signed_at(signed["reply"], signed["verified"])
        if not pin.verify_advert(site, message, signed["signature"]):
            raise _refused(
                ctx,
                task,
                f"the relayed reply of {site!r} is not signed by the key this site's roster "
                "pins for it at that point",
            )
        out[site] = signed["reply"]
    if "seeds" in wire:
        plain = None if layout is None else layout()
        out = {SECURE_TOTAL: _unmasked(ctx, task, out, wire["seeds"], plain)}
    return {"beta": beta, "round": at, "base": base, "replies": out}


KEPT_TOTALS = "verified path totals"
"""The :data:`ctx.cache <fedstats.site.task.SiteContext.cache>` entry of the totals kept."""
KEPT_TOTAL_BYTES = 256 * 2**20
"""The most bytes of relayed totals a site keeps (the oldest are dropped first, but never
those of its last verified request)."""


def _total_key(point: PathPoint, at: int, beta: np.ndarray, base: np.ndarray) -> tuple:
    """What a kept total is found by: the relayed point, its round and base, and the request
    and sites of the path (all that its replies' signatures covered)."""
    return (point.task, point.request, point.sites, at, point_digest(beta), point_digest(base))


def _keep_totals(ctx: SiteContext, point: PathPoint, *relayed: dict[str, Any] | None) -> None:
    """Keep the totals of the relayed points this site just verified (a damped path's:
    :class:`~fedstats.contract.paths.ReplyTotal`), so that the next request may relay a
    trial's base without its replies (:attr:`~fedstats.contract.paths.PathRequest.accepted_kept`).
    Bounded by :data:`KEPT_TOTAL_BYTES`."""
    kept: dict[tuple, ReplyTotal] = ctx.cache.setdefault(KEPT_TOTALS, {})
    fresh = []
    for evaluated in relayed:
        if evaluated is None or not isinstance(evaluated["replies"], ReplyTotal):
            continue
        key = _total_key(point, evaluated["round"], evaluated["beta"], evaluated["base"])
        kept.pop(key, None)
        kept[key] = evaluated["replies"]  # the newest last, with its evaluations
        fresh.append(key)

    def size(total: ReplyTotal) -> int:
        return sum(np.asarray(value).nbytes for value in total.fields.values())

    used = sum(size(total) for total in kept.values())
    for key in list(kept):
        if used <= KEPT_TOTAL_BYTES or key in fresh:
            break
        used -= size(kept.pop(key))


def _relayed_point(
    ctx: SiteContext, task: str, wire: dict[str, Any], point: PathPoint
) -> tuple[np.ndarray, int, np.ndarray]:
    """A relayed point's coefficients, round (before ``point``'s) and base."""
    beta = _point(ctx, task, wire["beta"], point.beta.shape, "a relayed point")
    base = (
        beta
        if "base" not in wire  # a base of its own
        else _point(ctx, task, wire["base"], point.beta.shape, "a relayed point's base")
    )
    at = wire["round"]
    if type(at) is not int or not 1 <= at < point.round:
        raise _refused(ctx, task, "a relayed point's round does not precede this one")
    return beta, at, base


def _kept_point(
    ctx: SiteContext, task: str, wire: Any, point: PathPoint, rule: NewtonPath
) -> dict[str, Any]:
    """A trial's base relayed without its replies (``"kept": true``): the total this site
    kept when it verified them in an earlier request of the same path (:func:`_keep_totals`),
    with its evaluations; refused when it kept none for that point."""
    if not (
        isinstance(rule, DampedNewtonPath)
        and isinstance(wire, dict)
        and set(wire) - {"base"} == {"beta", "round", KEPT_KEY}
        and wire[KEPT_KEY] is True
    ):
        raise _refused(ctx, task, "a relayed point without replies is malformed")
    beta, at, base = _relayed_point(ctx, task, wire, point)
    total = ctx.cache.get(KEPT_TOTALS, {}).get(_total_key(point, at, beta, base))
    if total is None:
        raise _refused(
            ctx,
            task,
            "the relayed base comes without its replies, and this site keeps no total of "
            "them (it keeps what it verified in the path's last requests): relay them",
        )
    return {"beta": beta, "round": at, "base": base, "replies": total}


def _layout(ctx: SiteContext, task: str, args: dict[str, Any]) -> Callable[[], ReplySchema | None]:
    """The plain reply schema of ``task`` at ``args``, asked only when masked replies are
    relayed (:attr:`fedstats.site.task.SiteContext.reply_schema`)."""
    return lambda: None if ctx.reply_schema is None else ctx.reply_schema(task, args)


SECURE_TOTAL = "total of the masked replies"
"""The one reply a masked relayed point becomes: the total every rule sums."""


def _unmasked(
    ctx: SiteContext,
    task: str,
    replies: dict[str, Any],
    seeds: Any,
    plain: ReplySchema | None,
) -> dict[str, Any]:
    """The total of signed masked replies: each relayed seed must be the one its site
    committed to, every reply of one session and precision, and then
    ``sum_u y_u - sum_u PRG(b_u)`` decodes to the summed fields ``plain`` lays out."""
    if plain is None:
        raise _refused(ctx, task, "masked replies are relayed only to the rounds of their fit")
    if not (
        isinstance(seeds, dict)
        and sorted(seeds) == sorted(replies)
        and all(isinstance(v, str) and len(v) == 2 * shamir.SECRET_BYTES for v in seeds.values())
    ):
        raise _refused(ctx, task, "the relayed seeds must be every site's self-mask seed (hex)")
    try:
        raw = {site: bytes.fromhex(seeds[site]) for site in replies}
        length = masked_length(plain)
    except (ValueError, MalformedRequestError):
        raise _refused(
            ctx, task, "the relayed seeds or the task's fields cannot be unmasked"
        ) from None
    for site, reply in replies.items():
        vector = reply.get(MASKED_FIELD)
        if not (
            set(reply) == {MASKED_FIELD, *MASK_FACTS}
            and isinstance(reply["session"], str)
            and type(reply["fraction_bits"]) is int
            and isinstance(vector, np.ndarray)
            and vector.dtype == np.uint64
            and vector.shape == (length,)
        ):
            raise _refused(ctx, task, f"the relayed reply of {site!r} is not a masked reply")
        if reply["seed_commitment"] != seed_commitment(reply["session"], site, raw[site]):
            raise _refused(ctx, task, f"the seed relayed for {site!r} is not the one it signed")
    facts = {(r["session"], r["fraction_bits"]) for r in replies.values()}
    if len(facts) != 1:
        raise _refused(ctx, task, "the relayed masked replies come from different sessions")
    ((_, bits),) = facts
    try:
        ring.check_fraction_bits(bits)
    except StudyConfigurationError:
        raise _refused(ctx, task, "the relayed masked replies name no valid precision") from None
    total = unmasked_total({s: r[MASKED_FIELD] for s, r in replies.items()}, raw)
    return unflatten(ring.decode(total, bits), plain)


def check_masked_round(ctx: SiteContext, task: str, point: PathPoint, session: Any) -> None:
    """A round of a path inside secure aggregation: the session's sites must be the path's.
    Every site masks against all its graph neighbours in the session (it refuses a masked
    round missing one's shares: :func:`fedstats.site.secure_aggregation.open_shares`), so the
    pairwise masks cancel in the total every site recomputes next round."""
    if set(session.sites) != set(point.sites):
        raise _refused(
            ctx,
            task,
            "a masked round of a path needs every site of the path, and only those, in its "
            "secure-aggregation session (the pairwise masks must cancel in the total)",
        )


def _point(ctx: SiteContext, task: str, value: Any, shape: Any, what: str) -> np.ndarray:
    if not (
        isinstance(value, np.ndarray)
        and value.ndim == 1
        and value.dtype.kind == "f"
        and (shape is None or value.shape == shape)
        and np.isfinite(value).all()
    ):
        raise _refused(ctx, task, f"{what} must be a finite array of the coefficients")
    return value.astype(np.float64)


def _unverified(task: str, args: dict[str, Any], path: Any) -> PathPoint | None:
    """A site that does not verify paths still signs its replies to a request that carries a
    well-formed one: the signature vouches for the reply, not the point (a verifying site
    vouches for the point by its own signature, which every round must relay)."""
    if not isinstance(path, dict):
        return None
    sites, round_ = path.get("sites"), path.get("round")
    beta = PATH_RULES[task].point(args)
    base = path.get("base", beta)
    if not (
        isinstance(sites, list)
        and all(isinstance(s, str) for s in sites)
        and type(round_) is int
        and isinstance(beta, np.ndarray)
        and isinstance(base, np.ndarray)
    ):
        return None
    return PathPoint(task, request_digest(args), tuple(sites), round_, beta, base)


def remember(ctx: SiteContext, args: dict[str, Any], point: PathPoint) -> None:
    """Keep a point this site answered on a verified path, for evaluations of the fit."""
    if not ctx.verified_paths:
        return
    points: dict = ctx.cache.setdefault(_REMEMBERED, {})
    while len(points) >= REMEMBERED_POINTS:
        points.pop(next(iter(points)))
    points[(design_digest(args.get("design")), point_digest(point.beta))] = None
    rule = PATH_RULES.get(point.task)
    if isinstance(rule, DampedNewtonPath) and rule.warm_start:
        key = (point.task, warm_start_digest(args, rule.warm_start), point_digest(point.beta))
        points[key] = None


def _warm(ctx: SiteContext, task: str, rule: NewtonPath, args: dict[str, Any]) -> bool:
    """Whether round 1's point is one this site answered on a verified path of the same
    request but the rule's ``warm_start`` argument."""
    if not (isinstance(rule, DampedNewtonPath) and rule.warm_start):
        return False
    key = (task, warm_start_digest(args, rule.warm_start), point_digest(args["beta"]))
    return key in ctx.cache.get(_REMEMBERED, {})


def _check_evaluated_point(ctx: SiteContext, task: str, args: dict[str, Any]) -> None:
    beta = args.get("beta")
    points = ctx.cache.get(_REMEMBERED, {})
    if not (
        isinstance(beta, np.ndarray)
        and beta.dtype.kind == "f"
        and (design_digest(args.get("design")), point_digest(beta)) in points
    ):
        raise _refused(
            ctx,
            task,
            "a fitted model is evaluated only at coefficients this site answered on a "
            "verified path of the same design",
        )


_REMEMBERED = "verified path points"


def signature(ctx: SiteContext, point: PathPoint, payload: dict[str, Any]) -> str:
    """This site's signature over its reply at a verified point."""
    return ctx.secure_aggregation.sign_advert(point.statement(payload, ctx.verified_paths))


def _sites(
    ctx: SiteContext, task: str, sites: Any, pin: Any, *, member: bool = True
) -> tuple[str, ...]:
    if not (
        isinstance(sites, list)
        and sites
        and all(isinstance(s, str) for s in sites)
        and sites == sorted(set(sites))
    ):
        raise _refused(ctx, task, "the path's sites must be a sorted list of distinct names")
    if (member and ctx.name not in sites) or any(s not in pin.sites for s in sites):
        raise _refused(ctx, task, "the path's sites must include this site and be on its roster")
    return tuple(sites)


def _sums_fit(rule: NewtonPath, reply: dict[str, Any], p: int, args: dict[str, Any]) -> bool:
    """Whether a relayed reply holds the fields the rule reads, each of its shape."""
    for name, shape in rule.fields(p, args).items():
        value = reply.get(name)
        if shape == ():
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
        elif not (isinstance(value, np.ndarray) and value.shape == shape):
            return False
    return True


def _refused(ctx: SiteContext, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=ctx.name, task=task, reason=reason, rule="path")
