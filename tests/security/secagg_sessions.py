"""A coordinator played by hand: drives sites through a secure-aggregation session round by
round, so that a test can tamper with any message a real coordinator could send.

A session runs over site contexts (:class:`fedstats.site.task.SiteContext`), calling the
site's own handlers as :class:`fedstats.Silo` would after decoding a request, or over silos,
each request then encoded and answered by :meth:`fedstats.Silo.handle`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

import fedstats
from fedstats.contract import codec
from fedstats.contract.secagg_session import Adverts, SessionPlan, signature_hex
from fedstats.contract.secure_aggregation import MaskBlock
from fedstats.schema import Array
from fedstats.secagg import graph, roster
from fedstats.site import secure_aggregation as secagg_site
from fedstats.site import secure_unmasking as secagg_unmasking
from fedstats.site.task import SiteContext


def contexts(names: list[str], *, pinned: bool = True) -> dict[str, SiteContext]:
    """Site contexts with no rows, each pinning a roster of ``names`` when ``pinned``."""
    pins = roster.in_process_pins(names) if pinned else {}
    out = {}
    for name in names:
        context = SiteContext(name=name, frame=pd.DataFrame(), policy=fedstats.DisclosurePolicy())
        context.secure_aggregation = pins.get(name)
        out[name] = context
    return out


@dataclass
class Session:
    """One session as the coordinator sees it, filled in round by round."""

    plan: SessionPlan
    contexts: dict[str, SiteContext]
    silos: dict[str, fedstats.Silo] | None = None
    adverts: Adverts | None = None
    graph: graph.Graph | None = None
    sealed: dict[str, list[bytes]] = field(default_factory=dict)
    masked: dict[str, np.ndarray] = field(default_factory=dict)
    signatures: dict[str, np.ndarray] = field(default_factory=dict)

    def call(self, site: str, task: str, args: dict) -> dict:
        """``site``'s reply to one request, through its silo when the session has silos."""
        if self.silos is not None:
            request = codec.encode({"task": task, "args": args})
            reply = codec.decode(self.silos[site].handle(request))
            if reply["status"] != "ok":
                raise AssertionError(f"{site} answered {task} with {reply['error']}")
            return reply["result"]
        handlers = {
            "secagg.advertise": secagg_site.advertise,
            "secagg.share": secagg_site.share,
            "secagg.confirm": secagg_unmasking.confirm,
            "secagg.unmask": secagg_unmasking.unmask,
        }
        return handlers[task](self.contexts[site], args).payload

    def advertise(self) -> Session:
        keys, signatures = {}, {}
        for site in self.plan.sites:
            reply = self.call(site, "secagg.advertise", self.plan.to_args())
            keys[site] = bytes(reply["keys"])
            signatures[site] = signature_hex(bytes(reply["signature"]))
        self.adverts = Adverts(keys, signatures)
        self.graph = self.plan.graph(keys[self.plan.contributor])
        return self

    def only(self, sites) -> Adverts:
        return Adverts(
            {s: self.adverts.keys[s] for s in sites},
            {s: self.adverts.signatures[s] for s in sites},
        )

    def share_args(self, site: str, neighbours=None) -> dict:
        """What the coordinator sends ``site`` to share its keys (``neighbours``: others)."""
        chosen = self.graph.neighbours(site) if neighbours is None else neighbours
        return {
            "session": self.plan.session,
            "contributor": self.only([self.plan.contributor]).to_wire(),
            "neighbours": self.only(chosen).to_wire(),
        }

    def share(self) -> Session:
        for site in self.plan.sites:
            reply = self.call(site, "secagg.share", self.share_args(site))
            self.sealed[site] = [bytes(row) for row in reply["sealed"]]
        return self

    def row(self, sender: str, receiver: str) -> bytes:
        """The share pair ``sender`` sealed for ``receiver``."""
        return self.sealed[sender][self.graph.neighbours(sender).index(receiver)]

    def block(self, site: str) -> MaskBlock:
        rows = [self.row(v, site) for v in self.graph.neighbours(site)]
        return MaskBlock(self.plan.session, rows)

    def mask(self, sites=None, values: dict[str, float] | None = None) -> Session:
        """The masked round for ``sites`` (all by default), each replying ``values[site]``."""
        plain = {"v": Array((1,))}
        for site in self.contexts if sites is None else sites:
            state = secagg_site.open_shares(self.contexts[site], self.block(site), "t")
            value = np.array([(values or {}).get(site, 0.0)])
            self.masked[site] = secagg_site.mask_reply(state, {"v": value}, None, plain, "t")[
                "masked"
            ]
        return self

    def confirm(self, sites, survivors) -> Session:
        args = {"session": self.plan.session, "survivors": self.plan.bitmap(survivors)}
        for site in sites:
            reply = self.call(site, "secagg.confirm", args)
            self.signatures[site] = reply["signature"]
        return self

    def unmask_args(self, survivors, signers=None) -> dict:
        signers = [s for s in self.plan.sites if s in (signers or self.signatures)]
        return {
            "session": self.plan.session,
            "survivors": self.plan.bitmap(survivors),
            "signers": self.plan.bitmap(signers),
            "signatures": np.stack([self.signatures[s] for s in signers]),
            "holders": self.plan.shape.degree + 1,
        }

    def unmask(self, site: str, survivors, signers=None) -> list[bytes]:
        """``site``'s revealed shares, one per holder (in the session's order)."""
        reply = self.call(site, "secagg.unmask", self.unmask_args(survivors, signers))
        return [bytes(row) for row in reply["shares"]]


def session(
    names: list[str],
    *,
    threshold: int | None = None,
    construction: str = "secagg+",
    pinned: bool = True,
    session_id: str = "a" * 32,
    sites: dict[str, SiteContext] | None = None,
    silos: dict[str, fedstats.Silo] | None = None,
) -> Session:
    """A session over ``names`` (fresh contexts unless ``sites`` or ``silos`` are given), not
    yet begun."""
    plan = SessionPlan(
        session_id,
        tuple(names),
        construction,
        len(names) if threshold is None else threshold,
        32,
    )
    if silos is not None:
        return Session(plan, {}, silos)
    return Session(plan, sites if sites is not None else contexts(names, pinned=pinned))
