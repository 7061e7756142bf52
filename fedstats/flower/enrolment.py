"""The study's enrolment list: each site name bound to its SuperNode key, signed by the study CA.

The attack it closes: with TLS and SuperNode authentication the SuperLink
serves only nodes whose public key the coordinator registered, but a node
*says* which site it is (its own ``site.toml``). A registered node of another
party that says ``region_1`` was served as ``region_1``, and the study's
coefficients were the fit on its rows.

The rule: at enrolment the study's PKI officer binds each site name to the
site's node key (``node.pub``) in ``enrolment.toml`` and signs the list with
the study CA's key (ECDSA P-256, SHA-256). The coordinator and every site hold
the list and the study CA certificate, so neither has to trust the other's
copy: a list changed after signing (a key swapped, a site added) is refused
(:class:`~fedstats.errors.EnrolmentError`).

- The coordinator serves a site only through the node whose key (the one the
  SuperLink authenticated it with, ``Grid.get_nodes()[...].public_key``) is
  enrolled for that name (:mod:`fedstats.flower.site_claims`).
- A site refuses to serve unless its own name is enrolled with the key its
  SuperNode signs with (:func:`check_own_key`).

A key is shown by its OpenSSH fingerprint (``SHA256:`` and the unpadded
base64 of the SHA-256 of the key's wire encoding, RFC 4253 §6.6), the same
text ``ssh-keygen -lf node.pub`` prints, so a site's administrator can
compare it with the compliance report by eye.

The file (TOML)::

    [enrolment]
    study = "tcga-brca"
    signature = "3045..."   # the study CA's ECDSA signature of the canonical bytes, hex

    [enrolment.sites]       # site = its node key, OpenSSH format (no comment)
    region_0 = "ecdsa-sha2-nistp256 AAAAE2VjZHNh..."
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedstats.errors import EnrolmentError, SiteIdentityError
from fedstats.toml_config import read_toml_file
from studyfiles.names import name_problem

ENROLMENT_VERSION = "fedstats enrolment v1"
SIGNATURE_HEX_CHARS = 2 * 72
"""Longest DER-encoded ECDSA P-256 signature, in hex."""


def key_line(key: ec.EllipticCurvePublicKey) -> str:
    """The key's OpenSSH line without a comment: ``ecdsa-sha2-nistp256 AAAA...``."""
    return key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """OpenSSH SHA-256 fingerprint of ``key`` (what ``ssh-keygen -lf`` prints)."""
    blob = base64.b64decode(key_line(key).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def load_node_key(text: str | bytes, *, what: str) -> ec.EllipticCurvePublicKey:
    """A node public key from an OpenSSH line or PEM (SubjectPublicKeyInfo); EC only.

    Flower accepts only EC keys on NIST curves for SuperNode authentication;
    :class:`EnrolmentError` names ``what`` otherwise.
    """
    raw = text.encode() if isinstance(text, str) else bytes(text)
    loaders = (serialization.load_ssh_public_key, serialization.load_pem_public_key)
    for load in loaders:
        try:
            key = load(raw.strip())
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
        if isinstance(key, ec.EllipticCurvePublicKey):
            return key
        raise EnrolmentError(f"{what}: a node key must be an EC key (Flower's node keys)")
    raise EnrolmentError(f"{what}: not an OpenSSH or PEM public key")


def load_private_node_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """A site's node private key (OpenSSH or PEM, unencrypted EC), as the SuperNode reads it."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise EnrolmentError(
            f"node key {path}: cannot be read ({error.strerror or error}); check "
            "[coordinator] auth_private_key in site.toml"
        ) from None
    for load in (serialization.load_ssh_private_key, serialization.load_pem_private_key):
        try:
            key = load(raw, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
    raise EnrolmentError(f"node key {path}: not an unencrypted EC private key (OpenSSH or PEM)")


def signed_bytes(study: str, keys: Mapping[str, ec.EllipticCurvePublicKey]) -> bytes:
    """The canonical bytes the study CA signs: version, study, (site, key line) sorted by site."""
    sites = [[site, key_line(keys[site])] for site in sorted(keys)]
    return json.dumps([ENROLMENT_VERSION, study, sites], separators=(",", ":")).encode()


@dataclass(frozen=True)
class Enrolment:
    """The sites of a study and the node key each one is bound to (verified against the CA)."""

    study: str
    keys: Mapping[str, ec.EllipticCurvePublicKey]
    source: str = "<enrolment>"

    def fingerprints(self) -> dict[str, str]:
        """Each enrolled site's key fingerprint."""
        return {site: fingerprint(key) for site, key in self.keys.items()}

    def fingerprint(self, site: str) -> str:
        """The fingerprint of the key ``site`` is bound to; :class:`EnrolmentError` if none."""
        key = self.keys.get(site)
        if key is None:
            raise EnrolmentError(
                f"enrolment {self.source}: site {site!r} is not enrolled (enrolled: "
                f"{sorted(self.keys)}); enrol its node.pub with 'python -m "
                "fedstats.flower.study_pki enrol' and give every party the new list"
            )
        return fingerprint(key)

    def site_of(self, key_fingerprint: str) -> str | None:
        """The site a key is enrolled for, or ``None``."""
        for site, key in self.keys.items():
            if fingerprint(key) == key_fingerprint:
                return site
        return None

    def check_claim(self, site: str, key: ec.EllipticCurvePublicKey | None, *, node: int) -> str:
        """The key's fingerprint if ``key`` is the one enrolled for ``site``.

        Otherwise :class:`SiteIdentityError` naming the site, the node, both
        fingerprints and, when the key is enrolled for another site, that site.
        """
        enrolled = self.fingerprint(site)
        claimed = "no key" if key is None else fingerprint(key)
        if claimed == enrolled:
            return claimed
        owner = None if key is None else self.site_of(claimed)
        whose = f"enrolled for site {owner!r}" if owner else "not enrolled for any site"
        raise SiteIdentityError(
            f"node {node} claims site {site!r} but authenticated with key {claimed} ({whose}); "
            f"{site!r} is enrolled with key {enrolled} in {self.source}. The node is not "
            "served; if the site changed its key, enrol the new node.pub and register it"
        )


def check_own_key(enrolment: Enrolment, site: str, own: ec.EllipticCurvePublicKey) -> str:
    """A site's own check before serving: its name is enrolled, with its own key.

    Returns the fingerprint; :class:`EnrolmentError` names the site and both
    fingerprints otherwise, so a node holding another party's key (or the
    study's files and a key of its own) cannot start as this site.
    """
    enrolled = enrolment.fingerprint(site)
    mine = fingerprint(own)
    if mine != enrolled:
        raise EnrolmentError(
            f"site {site!r}: this node's key {mine} is not the key {enrolled} enrolled for "
            f"{site!r} in {enrolment.source}; the site does not serve. Use the node key the "
            "study enrolled for this site, or have the new key enrolled"
        )
    return mine


def write_enrolment(
    path: Path,
    study: str,
    public_keys: Mapping[str, str],
    ca_key: ec.EllipticCurvePrivateKey,
) -> Enrolment:
    """Write ``path`` binding each site to its ``node.pub`` text, signed with the CA's key."""
    for site in public_keys:
        _check_name(site, "site", str(path))
    keys = _checked_keys(
        {site: load_node_key(text, what=f"site {site!r}") for site, text in public_keys.items()},
        source=str(path),
    )
    _check_name(study, "study", str(path))
    signature = ca_key.sign(signed_bytes(study, keys), ec.ECDSA(hashes.SHA256())).hex()
    lines = ["[enrolment]", f"study = {json.dumps(study)}", f'signature = "{signature}"', ""]
    lines.append("[enrolment.sites]")
    for site in sorted(keys):
        lines.append(f"# {site}: {fingerprint(keys[site])}")
        lines.append(f"{json.dumps(site)} = {json.dumps(key_line(keys[site]))}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Enrolment(study, keys, str(path))


def read_enrolment(path: Path, ca_certificate: Path, *, study: str | None = None) -> Enrolment:
    """The enrolment at ``path``, verified against the study CA certificate.

    :class:`EnrolmentError` (naming the file and the field) if it cannot be
    read, a field is missing or malformed, one key is enrolled for two sites,
    the signature is not the study CA's over exactly these bindings, or
    ``study`` is given and differs.
    """
    source = str(path)
    document = read_toml_file(
        path,
        EnrolmentError,
        what="enrolment",
        hint="check the 'enrolment' field of the configuration",
    )
    table = document.get("enrolment")
    if not isinstance(table, dict) or set(table) != {"study", "signature", "sites"}:
        raise EnrolmentError(
            f"enrolment {source}: needs exactly [enrolment] study, signature and [enrolment.sites]"
        )
    name, signature, listed = table["study"], table["signature"], table["sites"]
    _check_name(name, "study", source)
    if study is not None and name != study:
        raise EnrolmentError(f"enrolment {source}: field 'study' is {name!r}, not {study!r}")
    if not isinstance(listed, dict) or not listed:
        raise EnrolmentError(f"enrolment {source}: [enrolment.sites] lists no site")
    keys: dict[str, ec.EllipticCurvePublicKey] = {}
    for site, text in listed.items():
        _check_name(site, "site", source)
        if not isinstance(text, str):
            raise EnrolmentError(f"enrolment {source}: site {site!r}: the key must be text")
        keys[site] = load_node_key(text, what=f"enrolment {source}: site {site!r}")
    keys = _checked_keys(keys, source=source)
    _verify(signature, signed_bytes(name, keys), ca_public_key(ca_certificate), source)
    return Enrolment(name, keys, source)


def _check_name(value: object, what: str, source: str) -> None:
    """The names ``site.toml`` and ``study.toml`` accept (:mod:`studyfiles.names`)."""
    problem = name_problem(value)
    if problem is not None:
        raise EnrolmentError(f"enrolment {source}: {what} name: {problem}")


def _checked_keys(
    keys: Mapping[str, ec.EllipticCurvePublicKey], *, source: str
) -> dict[str, ec.EllipticCurvePublicKey]:
    """``keys`` if no key is bound to two sites (such a node could claim either)."""
    owners: dict[str, str] = {}
    for site, key in keys.items():
        shown = fingerprint(key)
        if shown in owners:
            raise EnrolmentError(
                f"enrolment {source}: key {shown} is enrolled for both {owners[shown]!r} and "
                f"{site!r}; each site needs a node key of its own"
            )
        owners[shown] = site
    return dict(keys)


def ca_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    """The study CA's public key, from its certificate (PEM); :class:`EnrolmentError` otherwise."""
    try:
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as error:
        raise EnrolmentError(
            f"study CA certificate {path}: cannot be read ({error.strerror or error})"
        ) from None
    except ValueError as error:
        raise EnrolmentError(
            f"study CA certificate {path}: not a PEM certificate ({error})"
        ) from None
    key = certificate.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise EnrolmentError(f"study CA certificate {path}: not the EC CA of the study PKI")
    return key


def _verify(signature: object, message: bytes, ca: ec.EllipticCurvePublicKey, source: str) -> None:
    if not isinstance(signature, str) or not re.fullmatch(
        rf"[0-9a-f]{{2,{SIGNATURE_HEX_CHARS}}}", signature
    ):
        raise EnrolmentError(f"enrolment {source}: field 'signature' is not a hex signature")
    try:
        ca.verify(bytes.fromhex(signature), message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise EnrolmentError(
            f"enrolment {source}: the study CA did not sign these bindings (the file was "
            "changed after signing, or signed by another CA); get the list from the study's "
            "PKI officer again"
        ) from None
