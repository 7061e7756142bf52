"""The coordinator's side of site identity: which Flower node may serve which site name.

A node answers ``query.identify`` with the name its own ``site.toml`` gives;
that is a claim, not a proof. The proof is the key the SuperLink
authenticated the node with (``Grid.get_nodes()``: each node's registered
public key, SubjectPublicKeyInfo PEM, which the SuperLink checks on every
request the node signs). :class:`SiteClaims` admits a claim only when

- with an enrolment list (:mod:`fedstats.flower.enrolment`): the node's key
  is the key enrolled for the name it claims; any other node claiming the
  name is refused (:class:`~fedstats.errors.SiteIdentityError`, recorded in
  :attr:`SiteClaims.refused`) and the study goes on with the enrolled node;
- in every case: no other node has claimed the same name (two live nodes
  claiming one name cannot both be the site; without an enrolment list
  nothing tells which one is, so both are refused and the error says so).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from fedstats.errors import EnrolmentError, SiteIdentityError
from fedstats.flower.enrolment import Enrolment, fingerprint, load_node_key

log = logging.getLogger(__name__)


class NodeDirectory(Protocol):
    """What :class:`SiteClaims` needs of a Flower ``Grid``: its nodes' registered keys."""

    def get_nodes(self) -> Iterable[Any]: ...


def node_keys(grid: NodeDirectory) -> dict[int, ec.EllipticCurvePublicKey | None]:
    """Each online node's authenticated public key (``None``: the node has none, or not EC)."""
    keys: dict[int, ec.EllipticCurvePublicKey | None] = {}
    for info in grid.get_nodes():
        node = int(info.node_id)
        raw = bytes(getattr(info, "public_key", b"") or b"")
        try:
            keys[node] = load_node_key(raw, what=f"node {node}") if raw else None
        except EnrolmentError:
            keys[node] = None
    return keys


@dataclass
class SiteClaims:
    """Claims of site names by nodes during discovery, checked against the enrolment."""

    enrolment: Enrolment | None
    bound: dict[str, int] = field(default_factory=dict)
    """Site -> the node admitted for it."""
    fingerprints: dict[str, str | None] = field(default_factory=dict)
    """Site -> the admitted node's key fingerprint (``None``: the node has no key)."""
    refused: list[dict[str, Any]] = field(default_factory=list)
    """Every refused claim, once however often its node repeats it: site, node, its key's
    fingerprint, the enrolled one, why."""

    def admit(self, site: str, node: int, key: ec.EllipticCurvePublicKey | None) -> bool:
        """Whether ``node`` (authenticated with ``key``) may serve ``site``; records refusals.

        Raises :class:`SiteIdentityError` for two nodes claiming one name
        without an enrolment list (nothing tells which one is the site).
        """
        claimed = None if key is None else fingerprint(key)
        if self.enrolment is not None:
            try:
                self.enrolment.check_claim(site, key, node=node)
            except SiteIdentityError as error:
                self._refuse(site, node, claimed, str(error))
                return False
        earlier = self.bound.get(site)
        if earlier is not None and earlier != node:
            message = (
                f"two nodes claim site {site!r}: node {earlier} (key "
                f"{self.fingerprints.get(site) or 'none'}) and node {node} (key "
                f"{claimed or 'none'}); the study has no enrolment list to tell which one is "
                f"{site!r}, so neither is served. Stop the node that is not {site!r}, or give "
                "study.toml an [identity] enrolment list"
            )
            self._refuse(site, node, claimed, message)
            raise SiteIdentityError(message)
        self.bound[site] = node
        self.fingerprints[site] = claimed
        return True

    def forget(self, site: str) -> None:
        """Drop ``site``'s node (lost): its next claim is checked afresh."""
        self.bound.pop(site, None)

    def record(self) -> dict[str, Any]:
        """What ``status.json`` keeps: the enrolment, each site's node and key, refusals."""
        enrolled = {} if self.enrolment is None else self.enrolment.fingerprints()
        return {
            "enrolment": None if self.enrolment is None else self.enrolment.source,
            "sites": {
                site: {
                    "node": str(node),
                    "fingerprint": self.fingerprints.get(site),
                    "enrolled": site in enrolled,
                }
                for site, node in sorted(self.bound.items())
            },
            "refused": list(self.refused),
        }

    def _refuse(self, site: str, node: int, claimed: str | None, reason: str) -> None:
        enrolled = None
        if self.enrolment is not None and site in self.enrolment.keys:
            enrolled = self.enrolment.fingerprint(site)
        refusal = {
            "site": site,
            "node": str(node),
            "fingerprint": claimed,
            "enrolled_fingerprint": enrolled,
            "reason": reason,
        }
        if refusal in self.refused:  # the same node claiming again at the next discovery poll
            return
        self.refused.append(refusal)
        log.warning("refused a claim of site %s: %s", site, reason)
