"""The secure-aggregation roster a site pins: who takes part, and the keys that vouch for them.

The attack it closes: in the semi-honest protocol (:mod:`fedstats.site.secure_aggregation`)
a site takes the session's sites and their public keys from the coordinator.
A coordinator that invents ``t - 1`` sites, or relays keys it made itself for
real sites, holds ``t`` shares of a site's mask seed, removes its mask and
sees its reply with only ``1/sqrt(t)`` of the noise the site's ledger was
charged for.

The defence is Bonawitz et al.'s (CCS 2017, §4, the actively secure variant):
every advertised key pair is signed with the site's long-term signing key,
and each site checks every relayed key pair against the signing keys *it*
pinned — a roster file from the study's PKI, the same public keys the
SuperLink authenticates the SuperNodes with (``fedstats.flower.study_pki``).
The signature covers the session, its ordered site list, construction,
threshold and fixed-point precision, so every site also knows that every
other site joined the same session. A site refuses (:class:`~fedstats.errors.DisclosureError`,
rule ``roster``) a session that names a site outside its roster or relays a
key pair that is unsigned or signed by another key.

A site without a pinned roster can still take part (in-process exploration,
a test bench), but it charges its ledger for the noise it adds itself
(``sigma / sqrt(t)``), not for the noise of the sum: nothing then bounds what
the coordinator can unmask.

The roster file (TOML)::

    [roster]
    study = "tcga-brca"

    [roster.sites]   # site = its signing public key, OpenSSH format
    region-0 = "ecdsa-sha2-nistp256 AAAAE2VjZHNh... region-0"
    region-1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5... region-1"

and ``site.toml``::

    [secure_aggregation]
    roster = "roster.toml"
    signing_key = "pki/region-0.key"   # this site's private key (the SuperNode key)
    require = false                     # true: patient-level tasks only inside secure aggregation
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from fedstats.errors import StudyConfigurationError
from fedstats.toml_config import read_toml_file

SIGNATURE_HEX_CHARS = 2 * 80
"""Longest signature a site sends: Ed25519 (64 bytes) or DER-encoded ECDSA P-256 (<= 72)."""

PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey


def advert_message(
    session: str,
    site: str,
    sites: Sequence[str],
    threshold: int,
    fraction_bits: int,
    encryption_key: str,
    masking_key: str,
    *,
    construction: str = "secagg",
) -> bytes:
    """The bytes a site signs for its key advertisement (canonical JSON): the session, its
    ordered sites, construction (which fixes the graph's degree), threshold and precision,
    and the site's two fresh public keys (hex)."""
    return json.dumps(
        [
            "fedstats secagg advertisement v2",
            session,
            site,
            list(sites),
            construction,
            threshold,
            fraction_bits,
            encryption_key,
            masking_key,
        ],
        separators=(",", ":"),
    ).encode()


def sign(key: PrivateKey, message: bytes) -> str:
    """Hex signature of ``message``: Ed25519, or ECDSA with SHA-256 for an EC key."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(message).hex()
    return key.sign(message, ec.ECDSA(hashes.SHA256())).hex()


def verify(key: PublicKey, message: bytes, signature_hex: str) -> bool:
    """Whether ``signature_hex`` is ``key``'s signature of ``message``.

    A valid signature is remembered (:data:`_VERIFIED`, by key, message and signature), so
    sites that share a process (the embedded runtime) check each relayed signature once,
    not once each; an invalid one is checked every time."""
    remembered = (_public_bytes(key), message, signature_hex)
    if remembered in _VERIFIED:
        return True
    try:
        signature = bytes.fromhex(signature_hex)
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        else:
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    if len(_VERIFIED) >= _VERIFIED_KEPT:
        _VERIFIED.pop(next(iter(_VERIFIED)))
    _VERIFIED[remembered] = None
    return True


_VERIFIED: dict[tuple[bytes, bytes, str], None] = {}
"""Signatures found valid, oldest first (a valid signature stays valid)."""
_VERIFIED_KEPT = 65_536


@dataclass(frozen=True)
class RosterPin:
    """The participants, their signing public keys and this site's own signing key.

    ``require``: the site answers tasks about patients only inside secure
    aggregation with this roster.
    """

    site: str
    sites: Mapping[str, PublicKey]
    signing_key: PrivateKey
    require: bool = False
    source: str = "<roster>"

    def __post_init__(self) -> None:
        if self.site not in self.sites:
            raise StudyConfigurationError(
                f"roster {self.source}: site {self.site!r} is not in it (sites: "
                f"{sorted(self.sites)})"
            )
        own = _public_bytes(self.signing_key.public_key())
        if own != _public_bytes(self.sites[self.site]):
            raise StudyConfigurationError(
                f"roster {self.source}: the signing key of site {self.site!r} does not match "
                "the public key the roster lists for it"
            )

    def unknown_sites(self, sites: Iterable[str]) -> list[str]:
        """The session's sites that are not on the roster."""
        return [s for s in sites if s not in self.sites]

    def sign_advert(self, message: bytes) -> str:
        return sign(self.signing_key, message)

    def verify_advert(self, site: str, message: bytes, signature_hex: str) -> bool:
        """Whether ``site``'s pinned key signed ``message``."""
        key = self.sites.get(site)
        return key is not None and verify(key, message, signature_hex)


def load_roster_pin(section: Any, *, site: str) -> RosterPin:
    """The pin a site's ``[secure_aggregation]`` section describes (roster and signing key)."""
    roster_path, key_path = Path(section.roster), Path(section.signing_key)
    return RosterPin(
        site=site,
        sites=read_roster(roster_path),
        signing_key=_read_private_key(key_path),
        require=bool(section.require),
        source=str(roster_path),
    )


def read_roster(path: Path) -> dict[str, PublicKey]:
    """Sites and their signing public keys from a roster file."""
    document = read_toml_file(
        path,
        StudyConfigurationError,
        what="roster",
        hint="check [secure_aggregation] roster in site.toml",
    )
    table = document.get("roster")
    listed = table.get("sites") if isinstance(table, dict) else None
    if not isinstance(listed, dict) or len(listed) < 2:
        raise StudyConfigurationError(
            f"roster {path}: needs [roster.sites] listing at least two sites and their keys"
        )
    keys: dict[str, PublicKey] = {}
    for name, text in listed.items():
        if not isinstance(text, str):
            raise StudyConfigurationError(f"roster {path}: site {name!r}: the key must be text")
        try:
            key = serialization.load_ssh_public_key(text.strip().encode())
        except (ValueError, UnsupportedAlgorithm) as error:
            raise StudyConfigurationError(
                f"roster {path}: site {name!r}: not an OpenSSH public key ({error})"
            ) from None
        if not isinstance(key, PublicKey):
            raise StudyConfigurationError(
                f"roster {path}: site {name!r}: only Ed25519 and ECDSA keys can sign"
            )
        keys[name] = key
    return keys


def write_roster(path: Path, study: str, public_keys: Mapping[str, str]) -> Path:
    """Write a roster file from each site's OpenSSH public-key line."""
    for name, text in public_keys.items():
        read_key = serialization.load_ssh_public_key(text.strip().encode())
        if not isinstance(read_key, PublicKey):
            raise StudyConfigurationError(f"site {name!r}: only Ed25519 and ECDSA keys can sign")
    lines = ["[roster]", f"study = {json.dumps(study)}", "", "[roster.sites]"]
    lines += [
        f"{json.dumps(name)} = {json.dumps(text.strip())}" for name, text in public_keys.items()
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def in_process_pins(sites: Sequence[str]) -> dict[str, RosterPin]:
    """A pinned roster for every site of an in-process federation (fresh Ed25519 keys):
    the sites are the frames the caller holds, so no site can be invented."""
    private = {s: ed25519.Ed25519PrivateKey.generate() for s in sites}
    public = {s: k.public_key() for s, k in private.items()}
    return {
        s: RosterPin(site=s, sites=public, signing_key=private[s], source="in-process")
        for s in sites
    }


def joined_pins(
    own: Mapping[str, RosterPin], study: Mapping[str, RosterPin]
) -> dict[str, RosterPin]:
    """``own`` sites pinned together with ``study``'s, as one study's roster: a site named in
    ``study`` keeps that site's signing key (the same hospital, e.g. its held-out rows), every
    site pins every site's public key."""
    keys = {name: study.get(name, pin).signing_key for name, pin in own.items()}
    public = {name: pin.sites[name] for name, pin in study.items()}
    public |= {name: key.public_key() for name, key in keys.items()}
    return {
        name: RosterPin(site=name, sites=public, signing_key=keys[name], source="in-process")
        for name in own
    }


def _read_private_key(path: Path) -> PrivateKey:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise StudyConfigurationError(
            f"signing key {path}: cannot be read ({error.strerror or error}); check "
            "[secure_aggregation] signing_key in site.toml"
        ) from None
    loaders = (serialization.load_ssh_private_key, serialization.load_pem_private_key)
    for load in loaders:
        try:
            key = load(raw, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
        if isinstance(key, PrivateKey):
            return key
    raise StudyConfigurationError(
        f"signing key {path}: not an unencrypted Ed25519 or ECDSA private key (OpenSSH or PEM)"
    )


def _public_bytes(key: PublicKey) -> bytes:
    """The key's OpenSSH bytes, computed once per key object (a site checks every relayed
    reply of every round with the same pinned keys)."""
    known = _PUBLIC_BYTES.get(id(key))
    if known is not None and known[0] is key:
        return known[1]
    data = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    if len(_PUBLIC_BYTES) >= _VERIFIED_KEPT:
        _PUBLIC_BYTES.pop(next(iter(_PUBLIC_BYTES)))
    _PUBLIC_BYTES[id(key)] = (key, data)  # the key is kept, so its id is not reused
    return data


_PUBLIC_BYTES: dict[int, tuple[PublicKey, bytes]] = {}
