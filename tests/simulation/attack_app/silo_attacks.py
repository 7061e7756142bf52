"""A malicious coordinator's attacks on the silo boundary, over any federation.

Each attack is taken from ``tests/security`` and sends its crafted requests
through a :class:`fedstats.Federation`'s transports only, so the same code
runs over Flower's simulation engine (the attacking ServerApp,
``attack_serverapp.py``) and in process (``test_simulation_attacks.py``).
Every probe ends in an outcome record: answered, or refused with the error's
type, rule (a resource limit's name for :class:`ResourceLimitError`), site
and task. The attacks are named here in code; nothing of the run config is
evaluated.

The study's sites (``study_frames``) are one public fact short of real ones:
the attacker knows that one patient of the first site has ``x`` above
:data:`OUTLIER` (the small cell) and that ``z`` is missing for two patients
there (the differencing pair).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import fedstats
from fedstats.contract import secure_aggregation as secagg_wire
from fedstats.contract.design import DesignSpec
from fedstats.contract.paths import PATH_KEY, Evaluated, PathRequest
from fedstats.contract.secagg_session import Adverts, SessionPlan, signature_hex
from fedstats.errors import FedstatsError
from fedstats.models.agree import agreed_design
from fedstats.models.path_relay import PathRelay
from fedstats.secagg import roster as secagg_roster
from fedstats.site import secure_aggregation as secagg_site
from fedstats.site.task import SiteContext

OUTLIER = 6.0
"""One patient of the first site has ``x`` above this; every other patient of every site is
below it."""
MISSING_Z = (5, 17)
"""The rows of the first site whose ``z`` is missing."""
BUDGET = 3.0
"""Each site's privacy budget (epsilon) for the study, set by its privacy officer."""
CONTROL_SIGMA, GREEDY_SIGMA = 8.0, 0.05
"""Noise multipliers of the private control release (within the budget) and of the greedy one
(far over it)."""
HEADER_NAMES = 120_000
"""Variable names in the oversized request: a JSON header of about 900 KB, past the 512 KiB a
site parses."""
LEVELS = 2_000
"""Agreed levels of the oversized design: past the 1,000 columns a site builds."""
MODEL = "y ~ x"


def study_frames(sites: tuple[str, ...], per_site: int = 200, seed: int = 11) -> dict:
    """The sites' frames: ``x`` rounded, ``z`` (two values missing at the first site), 0/1 ``y``;
    the first site's row 0 holds the outlier."""
    rng = np.random.default_rng(seed)
    frames = {}
    for i, site in enumerate(sites):
        x = np.clip(np.round(rng.normal(size=per_site), 3), -3.5, 3.5)
        z = rng.normal(size=per_site)
        if i == 0:
            x[0] = OUTLIER + 1.25
            z[list(MISSING_Z)] = np.nan
        y = (rng.random(per_site) < 1 / (1 + np.exp(-(0.5 * x - 0.3)))).astype(np.int64)
        frames[site] = pd.DataFrame({"x": x, "z": z, "y": y})
    return frames


@dataclass(frozen=True)
class Arena:
    """What the attacks need besides the federation: the study's name (the ledger scope a
    private request names) and the file injected code would create."""

    study: str
    marker: Path


Outcome = dict[str, Any]
Attack = Callable[[fedstats.Federation, Arena], list[Outcome]]


def rule_of(error: BaseException) -> str | None:
    """The rule a refusal names: a disclosure rule, or the resource limit."""
    for field in ("rule", "limit"):
        value = getattr(error, field, None)
        if isinstance(value, str):
            return value
    return None


def refused(attack: str, probe: str, error: BaseException) -> Outcome:
    return {
        "attack": attack,
        "probe": probe,
        "outcome": "refused",
        "error_type": type(error).__name__,
        "rule": rule_of(error),
        "site": getattr(error, "site", None),
        "task": getattr(error, "task", None),
        "term": getattr(error, "term", None),
    }


def answered(attack: str, probe: str, site: str | None = None, task: str | None = None) -> Outcome:
    return {"attack": attack, "probe": probe, "outcome": "answered", "error_type": None,
            "rule": None, "site": site, "task": task, "term": None}  # fmt: skip


def fit(attack: str, probe: str, model: fedstats.LogisticRegression, fed) -> Outcome:
    """A fit through the public API: answered, or the site's refusal it raised."""
    try:
        model.fit(fed)
    except FedstatsError as error:
        return refused(attack, probe, error)
    return answered(attack, probe)


def each_site(attack: str, probe: str, fed, task: str, args: dict, sites=None) -> list[Outcome]:
    """A hand-written request to each site (or ``sites``): one outcome per site, in order."""
    replies, failures = fed.gather(task, args, analysis=attack, sites=sites)
    return [
        refused(attack, probe, failures[site])
        if site in failures
        else answered(attack, probe, site, task)
        for site in (fed.sites if sites is None else sites)
        if site in failures or site in replies
    ]


# ------------------------------------------------------------------------- the attacks


def small_cell(fed, arena: Arena) -> list[Outcome]:
    """tests/security/test_cell_rules.py and test_reconstruction.py: a design column that
    marks one patient (a threshold past the first site's outlier)."""
    model = fedstats.LogisticRegression(f"y ~ I(x > {OUTLIER})")
    return [fit("small_cell", "indicator of one patient", model, fed)]


def differencing(fed, arena: Arena) -> list[Outcome]:
    """tests/security/test_differencing.py: a population two patients smaller through a
    missing value; the first fit is answered, the second refused."""
    return [
        fit("differencing", "all rows", fedstats.LogisticRegression(MODEL), fed),
        fit("differencing", "two patients fewer",
            fedstats.LogisticRegression("y ~ x + z", missing="drop"), fed),
    ]  # fmt: skip


def injected_formulas(marker: Path) -> dict[str, str]:
    """tests/security/test_formula_injection.py: formulas whose evaluation writes ``marker``."""
    system = f"__import__('os').system('touch {marker}')"
    chain = "x.__class__.__init__.__globals__['__builtins__']"
    return {
        "open": f"y ~ I(open({str(marker)!r}, 'w'))",
        "os.system": f"y ~ I({system})",
        "attribute chain": f"y ~ I({chain}['open']({str(marker)!r}, 'w'))",
    }


def formula_injection(fed, arena: Arena) -> list[Outcome]:
    """Injected code in a raw ``prepare`` (the public API would refuse the formula before
    sending it): each site refuses the term; the marker file must not exist afterwards."""
    out = []
    for probe, formula in injected_formulas(arena.marker).items():
        design = DesignSpec(formula=formula, outcome="y", variables=("x", "y"), levels={},
                            columns=("Intercept", "x"), site_intercepts=False,
                            sites=fed.sites).to_wire()  # fmt: skip
        out += each_site("formula_injection", probe, fed, "prepare", {"design": design})
    return out


def crafted_point(fed, arena: Arena) -> list[Outcome]:
    """tests/security/test_verified_paths.py::test_a_crafted_point_is_refused_at_every_round_
    through_raw_requests: a huge coefficient vector with no path, with hand-written paths, and
    at round 2 after an honest round 1."""
    wire = fedstats.LogisticRegression(MODEL).agree(fed, "crafted").spec.to_wire()
    p = len(wire["columns"])
    crafted = np.full(p, 1e6)
    out = []
    for probe, path in (
        ("no path", None),
        ("hand-written path", {"sites": list(fed.sites), "round": 1}),
        ("one site's path", {"sites": [fed.sites[0]], "round": 1}),
        ("text path", "round 1"),
    ):
        args = {"design": wire, "beta": crafted}
        if path is not None:
            args[PATH_KEY] = path
        out += each_site("crafted_point", probe, fed, "logistic.summaries", args)
    relay = PathRelay(fed)
    zero = np.zeros(p)
    honest = relay.arguments({"design": wire, "beta": zero}, zero, zero)
    out += each_site("crafted_point", "honest round 1", fed, "logistic.summaries", honest)
    relay.answered(zero, zero)
    previous: Evaluated = relay.last
    at = PathRequest(tuple(sorted(previous.replies)), 2, crafted, previous=previous).to_wire()
    args = {"design": wire, "beta": crafted, PATH_KEY: at}
    return out + each_site("crafted_point", "round 2 off the step", fed, "logistic.summaries", args)


def forged_adverts(plan: SessionPlan, sites: list[str], forge: dict | None) -> Adverts:
    """Keys the coordinator made for ``sites`` in ``plan``'s session, each advert signed with
    the key ``forge`` holds for the site (``None``: unsigned)."""
    keys, signatures = {}, {}
    for site in sites:
        context = SiteContext(site, pd.DataFrame(), fedstats.DisclosurePolicy())
        if forge is not None:
            context.secure_aggregation = forge[site]
        reply = secagg_site.advertise(context, plan.to_args()).payload
        keys[site] = bytes(reply["keys"])
        signatures[site] = signature_hex(bytes(reply["signature"]))
    return Adverts(keys, signatures)


def secure_aggregation_roster(fed, arena: Arena) -> list[Outcome]:
    """tests/security/test_secure_aggregation_roster.py: a session of the first site and four
    invented ones; then a session of the real sites whose other keys the coordinator made and
    signed with keys of its own, or left unsigned (SecAgg+, the default construction)."""
    attack, target = "secure_aggregation_roster", fed.sites[0]
    invented = (target, *(f"sybil-{i}" for i in range(4)))
    plan = SessionPlan("1" * 32, invented, "secagg+", len(invented), 32)
    out = each_site(
        attack, "invented sites", fed, secagg_wire.ADVERTISE_TASK, plan.to_args(), [target]
    )
    others = [s for s in fed.sites if s != target]
    for session, probe, forge in (
        ("2" * 32, "keys signed by the coordinator", secagg_roster.in_process_pins(fed.sites)),
        ("3" * 32, "unsigned keys", None),
    ):
        plan = SessionPlan(session, tuple(fed.sites), "secagg+", len(fed.sites), 32)
        replies, failures = fed.gather(
            secagg_wire.ADVERTISE_TASK, plan.to_args(), analysis=attack, sites=[target]
        )
        if target in failures:
            out.append(refused(attack, f"{probe}: advertise", failures[target]))
            continue
        own = replies[target]
        made = forged_adverts(plan, others, forge)
        keys = {target: bytes(own["keys"]), **made.keys}
        signatures = {target: signature_hex(bytes(own["signature"])), **made.signatures}
        drawn = plan.graph(keys[plan.contributor])

        def only(sites, keys=keys, signatures=signatures):
            return Adverts({v: keys[v] for v in sites}, {v: signatures[v] for v in sites})

        args = {
            "session": session,
            "contributor": only([plan.contributor]).to_wire(),
            "neighbours": only(drawn.neighbours(target)).to_wire(),
        }
        out += each_site(attack, probe, fed, secagg_wire.SHARE_TASK, args, [target])
    return out


def private_args(fed, arena: Arena, sigma: float) -> dict:
    """A record-level private gradient of ``y ~ x`` at beta = 0 with noise multiplier ``sigma``."""
    spec, _ = agreed_design(fed, MODEL, analysis="private")
    p = spec.n_params
    return {
        "design": spec.to_wire(),
        "beta": np.zeros(p),
        "clip": {"row_norm": 2.0, "scaling": np.tile([0.0, 4.0], (p, 1))},
        "release": "gradient",
        "dp": {"noise_multipliers": {"gradient": sigma}, "study": arena.study,
               "analysis": "private", "note": ""},
    }  # fmt: skip


def over_budget(fed, arena: Arena) -> list[Outcome]:
    """tests/security/test_private_refusals.py and the ledger's budget: a release within the
    budget (the control, charged) and one far over it (refused, nothing charged)."""
    control = private_args(fed, arena, CONTROL_SIGMA)
    greedy = private_args(fed, arena, GREEDY_SIGMA)
    return [
        *each_site("over_budget", "within the budget", fed, "logistic.summaries", control),
        *each_site("over_budget", "over the budget", fed, "logistic.summaries", greedy),
    ]


def oversized(fed, arena: Arena) -> list[Outcome]:
    """tests/security/test_resource_limits.py: a request whose header is too long to parse, and
    a design with more columns than a site builds."""
    names = [f"v{i:06d}" for i in range(HEADER_NAMES)]
    describe = {"variables": names, "levels_for": [], "levels_known": [], "list_levels": False}
    out = each_site("oversized", "header", fed, "describe", describe)
    levels = [f"level{i:05d}" for i in range(LEVELS)]
    design = DesignSpec(formula="y ~ C(x)", outcome="y", variables=("x", "y"),
                        levels={"x": levels}, columns=("Intercept", *levels[1:]),
                        site_intercepts=False, sites=fed.sites).to_wire()  # fmt: skip
    return out + each_site("oversized", "design columns", fed, "prepare", {"design": design})


ATTACKS: tuple[tuple[str, Attack], ...] = (
    ("small_cell", small_cell),
    ("differencing", differencing),
    ("formula_injection", formula_injection),
    ("crafted_point", crafted_point),
    ("secure_aggregation_roster", secure_aggregation_roster),
    ("over_budget", over_budget),
    ("oversized", oversized),
)
"""Every attack, in the order both runs make them (a site's guard remembers earlier ones)."""


def run_attacks(fed: fedstats.Federation, arena: Arena) -> list[Outcome]:
    """Every attack of :data:`ATTACKS`; an attack that fails in an unforeseen way is recorded
    as one outcome ``failed`` with the error's type and text."""
    out: list[Outcome] = []
    for name, attack in ATTACKS:
        try:
            out += attack(fed, arena)
        except Exception as error:  # noqa: BLE001 - recorded, and the test then fails on it
            out.append({**refused(name, "unforeseen", error), "outcome": "failed",
                        "detail": f"{type(error).__name__}: {error}"[:2000]})  # fmt: skip
    return out


def twin_differencing(fed: fedstats.Federation) -> Outcome:
    """The second fit of the differencing pair, asked of the first site through another node
    that claims it: the site must remember the first fit, whichever node carried it."""
    model = fedstats.LogisticRegression("y ~ x + z", missing="drop")
    return fit("twin_differencing", "two patients fewer, through a twin node", model, fed)
