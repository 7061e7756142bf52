"""A study's keys and certificates for Flower's TLS and SuperNode authentication.

A study needs three kinds of files, all made offline:

- the **study CA** (``study-ca.crt``, ``study-ca.key``): the coordinator keeps
  the key; every site and the coordinator's ``flwr`` CLI get the certificate
  and trust the SuperLink only if its certificate is signed by it;
- the **SuperLink certificate** (``superlink.crt``, ``superlink.key``) for the
  host names and addresses the sites use to reach the SuperLink, signed by
  the study CA (``flower-superlink --ssl-ca-certfile study-ca.crt
  --ssl-certfile superlink.crt --ssl-keyfile superlink.key``);
- one **node key** per site (``node.key``, ``node.pub``): an ECDSA P-256 key
  pair in OpenSSH format. The site keeps ``node.key``
  (``flower-supernode --auth-supernode-private-key node.key``); the
  coordinator registers ``node.pub`` (``flwr supernode register node.pub``)
  on a SuperLink started with ``--enable-supernode-auth``. A SuperNode whose
  key is not registered is refused by the SuperLink.

Command line (writes into ``--out``; existing files are never overwritten)::

    python -m fedstats.flower.study_pki ca --out pki/ --study tcga-brca
    python -m fedstats.flower.study_pki superlink --out pki/ --host coordinator.example.org
    python -m fedstats.flower.study_pki node --out pki/region_0/ --site region_0
    python -m fedstats.flower.study_pki roster --out roster.toml --study tcga-brca \
        --node region_0=pki/region_0/node.pub --node region_1=pki/region_1/node.pub
    python -m fedstats.flower.study_pki enrol --out pki/enrolment.toml --ca pki/ \
        --study tcga-brca --node region_0=pki/region_0/node.pub --node region_1=...

The **enrolment list** (``enrolment.toml``, :mod:`fedstats.flower.enrolment`)
binds each site name to its ``node.pub`` and is signed with the study CA's
key. The coordinator (``study.toml``: ``[identity] enrolment``, ``study_ca``)
serves a site only through the node whose SuperLink-authenticated key is
enrolled for it, and each site (``site.toml``: ``[coordinator] enrolment``)
serves only if its own name is enrolled with its own node key. It prints
each site's key fingerprint (as ``ssh-keygen -lf node.pub`` does).

The **roster** lists every site's ``node.pub``: each site keeps a copy and
names it in ``site.toml`` (``[secure_aggregation] roster = "roster.toml"``,
``signing_key = "pki/node.key"``), so secure-aggregation sessions are signed
with the SuperNode keys and a site refuses sites or keys not on its roster
(:mod:`fedstats.secagg.roster`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedstats.errors import StudyConfigurationError, StudyPkiError
from fedstats.flower.enrolment import Enrolment, ca_public_key, write_enrolment
from fedstats.secagg.roster import write_roster

CURVE = ec.SECP256R1()
"""NIST P-256: accepted by Flower for node keys and by every TLS stack."""
CA_DAYS = 3 * 365
LEAF_DAYS = 365


@dataclass(frozen=True)
class StudyCa:
    """The study CA's certificate and private key files."""

    certificate: Path
    key: Path


@dataclass(frozen=True)
class ServerCertificate:
    """A SuperLink's TLS certificate and private key files."""

    certificate: Path
    key: Path


@dataclass(frozen=True)
class NodeKey:
    """A site's SuperNode authentication key pair (OpenSSH format)."""

    private_key: Path
    public_key: Path


def make_study_ca(out: Path, study: str, *, days: int = CA_DAYS) -> StudyCa:
    """Write a self-signed study CA (``study-ca.crt``, ``study-ca.key``) into ``out``."""
    paths = StudyCa(out / "study-ca.crt", out / "study-ca.key")
    _refuse_existing(paths.certificate, paths.key)
    key = ec.generate_private_key(CURVE)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{study} study CA")])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(paths.key, _pem_private(key))
    paths.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return paths


def make_server_certificate(
    out: Path, ca: StudyCa, hosts: Sequence[str], *, days: int = LEAF_DAYS
) -> ServerCertificate:
    """Write the SuperLink's certificate for ``hosts`` (names or IP addresses), signed by ``ca``."""
    if not hosts:
        raise StudyPkiError("name at least one host (DNS name or IP address) of the SuperLink")
    paths = ServerCertificate(out / "superlink.crt", out / "superlink.key")
    _refuse_existing(paths.certificate, paths.key)
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise StudyPkiError(f"{ca.key} is not the EC key of a study CA made by this module")
    ca_certificate = x509.load_pem_x509_certificate(ca.certificate.read_bytes())
    key = ec.generate_private_key(CURVE)
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_alternative_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    _write_private(paths.key, _pem_private(key))
    paths.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return paths


def make_node_key(out: Path, site: str) -> NodeKey:
    """Write a site's node key pair into ``out``: ``node.key``, ``node.pub`` (OpenSSH, P-256)."""
    paths = NodeKey(out / "node.key", out / "node.pub")
    _refuse_existing(paths.private_key, paths.public_key)
    key = ec.generate_private_key(CURVE)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write_private(paths.private_key, private)
    paths.public_key.write_bytes(public + f" {site}\n".encode())
    return paths


def enrol_sites(out: Path, ca: StudyCa, study: str, public_keys: dict[str, str]) -> Enrolment:
    """Write the enrolment list binding each site to its ``node.pub`` text, signed by ``ca``."""
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise StudyPkiError(f"{ca.key} is not the EC key of a study CA made by this module")
    if not ca.certificate.is_file():
        raise StudyPkiError(f"{ca.certificate}: no study CA certificate beside its key")
    if ca_public_key(ca.certificate).public_numbers() != ca_key.public_key().public_numbers():
        raise StudyPkiError(
            f"{ca.key} is not the key of {ca.certificate}: no party could verify the list it "
            "signs; give the folder holding the study CA's own certificate and key"
        )
    return write_enrolment(out, study, public_keys, ca_key)


def _site_keys(items: Sequence[str]) -> dict[str, str]:
    """``SITE=path/to/node.pub`` arguments: each site's OpenSSH public-key line."""
    keys = {}
    for item in items:
        site, _, path = item.partition("=")
        if not site or not path:
            raise StudyPkiError(f"--node {item!r}: give SITE=path/to/node.pub")
        if site in keys:
            raise StudyPkiError(f"--node: site {site!r} is given twice")
        keys[site] = Path(path).read_text(encoding="utf-8")
    return keys


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not signs_certificates,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _alternative_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _pem_private(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _refuse_existing(*paths: Path) -> None:
    existing = [str(path) for path in paths if path.exists()]
    if existing:
        raise StudyPkiError(
            f"{', '.join(existing)} already exist(s); move them away or choose another --out"
        )
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only."""
    path.touch(mode=0o600, exist_ok=False)
    path.write_bytes(data)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``ca``, ``superlink``, ``node``, ``roster``, ``enrol`` (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ca = commands.add_parser("ca", help="make the study CA")
    ca.add_argument("--out", type=Path, required=True)
    ca.add_argument("--study", required=True, help="the study's name (in the CA's name)")
    link = commands.add_parser("superlink", help="make the SuperLink's TLS certificate")
    link.add_argument("--out", type=Path, required=True, help="folder holding study-ca.*")
    link.add_argument("--host", action="append", required=True, help="DNS name or IP (repeat)")
    node = commands.add_parser("node", help="make a site's SuperNode key pair")
    node.add_argument("--out", type=Path, required=True)
    node.add_argument("--site", required=True, help="the site's name (comment of node.pub)")
    roster = commands.add_parser("roster", help="write the secure-aggregation roster")
    roster.add_argument("--out", type=Path, required=True, help="the roster file to write")
    roster.add_argument("--study", required=True)
    roster.add_argument(
        "--node", action="append", required=True, help="SITE=path/to/node.pub (repeat)"
    )
    enrol = commands.add_parser("enrol", help="write the enrolment list signed by the study CA")
    enrol.add_argument("--out", type=Path, required=True, help="the enrolment file to write")
    enrol.add_argument("--ca", type=Path, required=True, help="folder holding study-ca.*")
    enrol.add_argument("--study", required=True)
    enrol.add_argument(
        "--node", action="append", required=True, help="SITE=path/to/node.pub (repeat)"
    )
    args = parser.parse_args(argv)
    if args.command == "enrol":
        try:
            _refuse_existing(args.out)
            made = enrol_sites(
                args.out,
                StudyCa(args.ca / "study-ca.crt", args.ca / "study-ca.key"),
                args.study,
                _site_keys(args.node),
            )
        except (StudyPkiError, StudyConfigurationError, OSError, ValueError) as error:
            parser.exit(2, f"error: {error}\n")
        print(args.out)
        for site, shown in sorted(made.fingerprints().items()):
            print(f"{site} {shown}")
        return
    if args.command == "roster":
        try:
            _refuse_existing(args.out)
            print(write_roster(args.out, args.study, _site_keys(args.node)))
        except (StudyPkiError, StudyConfigurationError, OSError, ValueError) as error:
            parser.exit(2, f"error: {error}\n")
        return
    try:
        if args.command == "ca":
            made: object = make_study_ca(args.out, args.study)
        elif args.command == "superlink":
            study_ca = StudyCa(args.out / "study-ca.crt", args.out / "study-ca.key")
            made = make_server_certificate(args.out, study_ca, args.host)
        else:
            made = make_node_key(args.out, args.site)
    except (StudyPkiError, OSError) as error:
        parser.exit(2, f"error: {error}\n")
    for path in vars(made).values():
        print(path)


if __name__ == "__main__":
    main()
