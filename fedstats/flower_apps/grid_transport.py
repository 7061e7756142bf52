"""The coordinator's Flower transport: one site's request bytes to its node, its reply back.

:class:`GridLink` wraps the ServerApp's :class:`flwr.serverapp.Grid`. It
finds which Flower node serves which site by asking every node
(``query.identify``; the answer comes from the site's own node config) and
admitting a claim only from the node whose authenticated key the study's
enrolment list binds to that name (:mod:`fedstats.flower.site_claims`), then
gives :class:`~fedstats.Federation` one ``bytes -> bytes`` transport per
site (:meth:`GridLink.transport`). Replies are collected with
``Grid.push_messages`` and pulled one message per call, each in its own
background thread, at a short poll interval (``Grid.send_and_receive``
sleeps 3 s between pulls; a pull of a dead site's half-uploaded reply can
last minutes: :mod:`fedstats.flower_apps.reply_pulls`).

Failure policy (``[policy]`` of ``study.toml``): a reply not back within
``round_timeout`` means the site is lost; with ``on_site_lost = "retry"``
its node is looked up again (a restarted site comes back as a new node) and
the request re-sent, up to ``retries`` times; then, or at once with
``"abort"``, the transport raises :class:`SiteLost` naming the site, which
the federation reports as :class:`~fedstats.errors.SiteUnreachableError`.

:class:`GridFederation` pushes a round's request to every site at once
before the federation collects the replies in order, so a round costs one
round trip, not one per site.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedstats.errors import MessageFormatError, SiteLost, SitesMissingError
from fedstats.flower import messages
from fedstats.flower.enrolment import Enrolment
from fedstats.flower.site_claims import SiteClaims, node_keys
from fedstats.flower_apps.reply_pulls import ReplyPulls
from fedstats.jobs.site_journal import digest
from fedstats.jobs.study_config import PolicySection
from fedstats.models.federation import Federation, Transport

log = logging.getLogger(__name__)

OTHERS_EVERY = 0.25
"""Seconds between pulls of the round's other messages while one site's reply is awaited."""
PULL_EVERY_CAP = 0.04
"""The longest gap between pulls of an awaited reply: the gap starts at the policy's
``poll_interval`` and doubles with each pull that finds nothing (each pull is an HTTP call
to the SuperLink; asked every 5 ms for the whole of a round they cost a share of a core)."""


class GridLink:
    """Sites reached through a Flower Grid, by name.

    Parameters
    ----------
    grid:
        The ServerApp's grid.
    policy:
        Timeouts, poll interval and what to do with a lost site.
    enrolment:
        The study's enrolment list: a site is served only through the node
        whose authenticated key is enrolled for it (:mod:`fedstats.flower.site_claims`).
    """

    def __init__(
        self, grid: Grid, policy: PolicySection, enrolment: Enrolment | None = None
    ) -> None:
        self.grid = grid
        self.policy = policy
        self.claims = SiteClaims(enrolment)
        self.nodes: dict[str, int] = {}
        self._in_flight: dict[tuple[str, str], str] = {}
        self.pulls = ReplyPulls(grid)
        """Replies pulled in the background, also while another site's is awaited."""
        self.lost: list[dict[str, Any]] = []
        self.bytes_sent = 0
        self.bytes_received = 0

    # -- which node serves which site ------------------------------------------------
    def discover(self, sites: Sequence[str], timeout: float | None = None) -> dict[str, int]:
        """Find the node of each of ``sites``; :class:`SitesMissingError` names those not found.

        Every claim is checked by :attr:`claims` (the node's authenticated key
        against the enrolment; one node per name): a refused node is never
        mapped and discovery goes on. Once every site is found, replies of
        nodes still being asked are awaited up to ``policy.identify_grace``
        seconds, so that a second claim of a name is seen, not missed.
        """
        wanted = set(sites)
        deadline = time.monotonic() + (
            self.policy.discovery_timeout if timeout is None else timeout
        )
        asked: dict[str, int] = {}
        found: dict[str, int] = {s: n for s, n in self.nodes.items() if s in wanted}
        alive = set(self.grid.get_node_ids())
        found = {s: n for s, n in found.items() if n in alive}
        settle: float | None = None
        while wanted - set(found) or (asked and time.monotonic() < (settle or deadline)):
            if not wanted - set(found) and settle is None:
                settle = min(deadline, time.monotonic() + self.policy.identify_grace)
            fresh = [n for n in self.grid.get_node_ids() if n not in asked.values()]
            fresh = [n for n in fresh if n not in found.values()]
            if fresh and settle is None:
                self._ask_identity(fresh, asked)
            if asked:
                self._read_claims(asked, wanted, found)
            if time.monotonic() > deadline and wanted - set(found):
                missing = sorted(wanted - set(found))
                refused = sorted({r["site"] for r in self.claims.refused} & set(missing))
                raise SitesMissingError(
                    f"site(s) {missing} did not answer on the Flower network within "
                    f"{self.policy.discovery_timeout:g} s; check that their SuperNodes run "
                    "with node config site-config pointing at their site.toml"
                    + (
                        f"; claims of {refused} by nodes whose key is not enrolled for them "
                        "were refused (see the status' site_identity)"
                        if refused
                        else ""
                    )
                )
            time.sleep(self.policy.poll_interval)
        self.nodes.update(found)
        return dict(self.nodes)

    def _ask_identity(self, nodes: list[int], asked: dict[str, int]) -> None:
        ids = self.grid.push_messages(
            [
                Message(
                    messages.pack(b""),
                    dst_node_id=node,
                    message_type=messages.IDENTIFY_MESSAGE_TYPE,
                    ttl=self._ttl(),
                )
                for node in nodes
            ]
        )
        asked.update({message_id: node for message_id, node in zip(ids, nodes, strict=True)})

    def _read_claims(self, asked: dict[str, int], wanted: set[str], found: dict[str, int]) -> None:
        """Admit the claims of the identify replies back so far (see :class:`SiteClaims`)."""
        claims: list[tuple[str, int]] = []
        for reply in self.grid.pull_messages(list(asked)):
            node = asked.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            try:
                site = messages.site_of(reply)
            except MessageFormatError as error:  # any registered node is asked: not a claim
                log.warning("node %s: identify reply ignored: %s", node, error)
                continue
            if site in wanted:
                claims.append((site, node))
        if not claims:
            return
        keys = node_keys(self.grid)
        for site, node in claims:
            if self.claims.admit(site, node, keys.get(node)):
                found[site] = node

    # -- requests ---------------------------------------------------------------------
    def transport(self, site: str) -> Transport:
        """The ``bytes -> bytes`` transport of one site."""

        def carry(request: bytes) -> bytes:
            return self.send(site, request)

        return carry

    def transports(self, sites: Sequence[str]) -> dict[str, Transport]:
        """One transport per site, in the given order."""
        return {site: self.transport(site) for site in sites}

    def prefetch(self, sites: Sequence[str], request: bytes) -> None:
        """Push ``request`` to every site now; :meth:`send` then only waits for each reply."""
        known = [
            s for s in sites if s in self.nodes and (s, digest(request)) not in self._in_flight
        ]
        if not known:
            return
        ids = self.grid.push_messages([self._message(s, request) for s in known])
        for site, message_id in zip(known, ids, strict=True):
            if message_id:
                self._in_flight[(site, digest(request))] = message_id
                self.bytes_sent += len(request)

    def send(self, site: str, request: bytes) -> bytes:
        """Carry ``request`` to ``site`` and return its reply, applying the failure policy."""
        attempts = 1 + (self.policy.retries if self.policy.on_site_lost == "retry" else 0)
        problem = ""
        for attempt in range(1, attempts + 1):
            message_id = self._in_flight.pop((site, digest(request)), None)
            if message_id is None:
                if site not in self.nodes:
                    self._find_again(site)
                message_id = self._push(site, request)
            reply = self._wait(message_id, self.policy.round_timeout)
            if reply is not None and not reply.has_error():
                payload = messages.unpack(reply)
                self.bytes_received += len(payload)
                return payload
            problem = (
                f"no reply within {self.policy.round_timeout:g} s"
                if reply is None
                else f"Flower error {reply.error.code}: {reply.error.reason}"
            )
            self.lost.append({"site": site, "attempt": attempt, "problem": problem})
            log.warning("site %s lost (attempt %d of %d): %s", site, attempt, attempts, problem)
            if attempt < attempts:
                self.nodes.pop(site, None)
                self.claims.forget(site)
                try:
                    self._find_again(site)
                except SitesMissingError as error:
                    problem = str(error)
                    break
        policy = self.policy.on_site_lost
        raise SiteLost(
            f"site {site!r} lost mid-round ({problem}); policy on_site_lost={policy!r}"
            + (f" with {self.policy.retries} retries" if policy == "retry" else "")
        )

    def _find_again(self, site: str) -> None:
        self.discover([site])

    def _ttl(self) -> float:
        return self.policy.round_timeout + 60.0

    def _message(self, site: str, request: bytes) -> Message:
        return Message(
            messages.pack(request),
            dst_node_id=self.nodes[site],
            message_type=messages.TASK_MESSAGE_TYPE,
            ttl=self._ttl(),
        )

    def _push(self, site: str, request: bytes) -> str:
        (message_id,) = self.grid.push_messages([self._message(site, request)])
        if not message_id:
            raise SiteLost(f"site {site!r}: the SuperLink refused the message")
        self.bytes_sent += len(request)
        return message_id

    def _wait(self, message_id: str, timeout: float) -> Message | None:
        """The reply to ``message_id`` within ``timeout`` seconds (``None``: no reply).

        Each message is pulled by its own background call (:class:`ReplyPulls`), so a pull
        Flower cannot finish (a dead site's half-uploaded reply) holds neither this deadline
        nor another site's reply. While it waits, the round's other messages are pulled too,
        every :data:`OTHERS_EVERY` seconds, and their replies kept: a reply waiting at the
        SuperLink cannot expire while the coordinator reads a slower site's. A reply whose
        objects the site is still uploading comes back as Flower's ``MESSAGE_UNAVAILABLE``
        error: it is pulled again until the deadline, so a live site on a loaded machine is
        not counted lost for a slow upload. The awaited message is pulled after the policy's
        ``poll_interval``, then at gaps doubling up to :data:`PULL_EVERY_CAP`; once its reply
        is in, every other message of the round is pulled at once."""
        deadline = time.monotonic() + timeout
        uploading: Message | None = None
        others_due = 0.0
        every = self.policy.poll_interval
        while True:
            reply = self.pulls.take(message_id)
            if reply is not None:
                if not (reply.has_error() and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE):
                    self._pull_others(message_id)
                    return reply
                uploading = reply
            now = time.monotonic()
            if now > deadline:
                self.pulls.drop(message_id)
                return uploading
            if self.pulls.start(message_id, every=every):
                every = min(2 * every, max(PULL_EVERY_CAP, self.policy.poll_interval))
            if now >= others_due:
                self._pull_others(message_id, every=OTHERS_EVERY)
                others_due = now + OTHERS_EVERY
            time.sleep(self.policy.poll_interval)

    def _pull_others(self, message_id: str, every: float = 0.0) -> None:
        """Pull the round's messages other than ``message_id``, each at most once per ``every``
        seconds (``0``: now, as when a reply came: the others are likely back too)."""
        for other in self._in_flight.values():
            if other != message_id:
                self.pulls.start(other, every=every)


class GridFederation(Federation):
    """A federation over a :class:`GridLink` that sends each round to all sites at once.

    Replies are still read, checked and recorded site by site, in order, by
    :meth:`Federation.gather`; the inventory's per-message seconds are then
    the waits for each reply, not the round trips.
    """

    def __init__(
        self, link: GridLink, sites: Sequence[str], *, study: str, verify_fingerprints: bool = True
    ) -> None:
        super().__init__(
            link.transports(sites), study=study, verify_fingerprints=verify_fingerprints
        )
        self.link = link

    def _dispatch(self, sites: list[str], request_bytes: bytes) -> None:
        """Push the request to every site before :meth:`Federation.gather` reads the replies."""
        self.link.prefetch(sites, request_bytes)
