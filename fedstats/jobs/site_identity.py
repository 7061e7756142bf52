"""A site's own identity check: it serves only as the name its node key is enrolled for.

``site.toml``'s ``[coordinator] enrolment`` names the study's enrolment list
(:mod:`fedstats.flower.enrolment`), signed by the study CA
(``root_certificates``). Before the site answers anything (the ClientApp
builds :class:`~fedstats.jobs.site_service.SiteService`; ``fedstats site run``
checks before starting its SuperNode), the list must verify against the CA,
enrol this site's name, and bind it to the public half of the node key the
SuperNode signs with (``auth_private_key``). So a node of another party that
holds the study's files and a key of its own cannot start as this site, and a
site whose binding is missing does not take part.
"""

from __future__ import annotations

from fedstats.errors import EnrolmentError
from fedstats.flower.enrolment import check_own_key, load_private_node_key, read_enrolment
from fedstats.jobs.site_config import SiteConfig


def check_site_identity(config: SiteConfig) -> str | None:
    """The fingerprint of this site's enrolled node key; ``None`` without an enrolment list.

    Raises :class:`~fedstats.errors.EnrolmentError` naming the site (and both
    fingerprints) when the list is not the study CA's, does not enrol the
    site, or binds it to another key.
    """
    coordinator = config.coordinator
    if coordinator is None or coordinator.enrolment is None:
        return None
    if coordinator.root_certificates is None or coordinator.auth_private_key is None:
        raise EnrolmentError(
            f"site {config.name!r}: [coordinator] enrolment needs root_certificates (the study "
            "CA that signed it) and auth_private_key (this site's node key)"
        )
    enrolment = read_enrolment(coordinator.enrolment, coordinator.root_certificates)
    own = load_private_node_key(coordinator.auth_private_key).public_key()
    return check_own_key(enrolment, config.name, own)
