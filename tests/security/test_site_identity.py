"""Attacks on site identity: a registered node of another party claiming a site's name.

Over Flower with SuperNode authentication the SuperLink serves only nodes
whose key was registered, but a node says which site it is. Before the
enrolment list, the coordinator mapped ``region_1`` to whichever node said
``region_1`` (here: node 99, another party's registered node) and the study
was fitted on its rows. These tests drive the coordinator's discovery
(:class:`~fedstats.flower_apps.grid_transport.GridLink`) with a grid whose nodes
carry the keys the SuperLink authenticated them with, and a site's own check
(:func:`~fedstats.jobs.site_identity.check_site_identity`) with real files.
The same attack over real Flower processes: ``tests/flower/test_flower_identity.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, RecordDict
from flwr.proto.node_pb2 import NodeInfo
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedstats import datasets
from fedstats.errors import ConfigError, EnrolmentError, SiteIdentityError, SitesMissingError
from fedstats.flower import messages, study_pki
from fedstats.flower.enrolment import (
    ENROLMENT_VERSION,
    fingerprint,
    key_line,
    read_enrolment,
    write_enrolment,
)
from fedstats.flower.local_study import write_site
from fedstats.flower_apps.grid_transport import GridLink
from fedstats.jobs.site_batch import load_job_config
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_identity import check_site_identity
from fedstats.jobs.site_service import SiteService
from fedstats.jobs.study_config import PolicySection

STUDY = "identity-study"
SITES = ("region_0", "region_1", "region_3")
"""Enrolled parties; ``region_3``'s node is the one that claims ``region_1``."""


class Reply:
    """An identify reply as ``Grid.pull_messages`` returns it."""

    def __init__(self, message_id: str, site: str) -> None:
        self.metadata = SimpleNamespace(reply_to_message_id=message_id)
        self.content = messages.identity(site)

    def has_error(self) -> bool:
        return False


class NodesGrid:
    """A Flower grid of nodes, each with the key the SuperLink authenticated it with and the
    site name its own site.toml claims. Replies come back in the nodes' order."""

    def __init__(self, nodes: dict[int, tuple[ec.EllipticCurvePublicKey | None, str]]) -> None:
        self.nodes = nodes
        self.pending: dict[str, int] = {}
        self.sent = 0

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def get_nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(
                node_id=node,
                public_key=b""
                if key is None
                else key.public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                ),
            )
            for node, (key, _site) in self.nodes.items()
        ]

    def push_messages(self, outgoing) -> list[str]:
        ids = []
        for message in outgoing:
            self.sent += 1
            ids.append(f"m{self.sent}")
            self.pending[ids[-1]] = message.metadata.dst_node_id
        return ids

    def pull_messages(self, message_ids) -> list[Reply]:
        back = [(m, self.pending.pop(m)) for m in message_ids if m in self.pending]
        order = list(self.nodes)
        back.sort(key=lambda item: order.index(item[1]))
        return [Reply(m, self.nodes[node][1]) for m, node in back]


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ServerApp's messages carry its run; outside Flower, set one."""
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A study CA, a node key per enrolled party, the signed enrolment list."""
    root = tmp_path_factory.mktemp("pki")
    ca = study_pki.make_study_ca(root, STUDY)
    keys = {site: study_pki.make_node_key(root / site, site) for site in SITES}
    enrolment = root / "enrolment.toml"
    study_pki.main(
        [
            "enrol",
            "--out",
            str(enrolment),
            "--ca",
            str(root),
            "--study",
            STUDY,
            *[f"--node={site}={keys[site].public_key}" for site in SITES],
        ]
    )
    public = {
        site: serialization.load_ssh_public_key(keys[site].public_key.read_bytes())
        for site in SITES
    }
    return SimpleNamespace(root=root, ca=ca, keys=keys, public=public, enrolment=enrolment)


def link(grid: NodesGrid, pki: SimpleNamespace | None, **policy: float) -> GridLink:
    enrolment = None if pki is None else read_enrolment(pki.enrolment, pki.ca.certificate)
    settings_ = {"discovery_timeout": 1.0, "poll_interval": 0.001, "identify_grace": 0.2}
    return GridLink(grid, PolicySection(**{**settings_, **policy}), enrolment=enrolment)


# -- the coordinator --------------------------------------------------------------------


def test_a_registered_node_claiming_another_sites_name_is_refused(pki) -> None:
    """Node 99 (region_3's registered, enrolled key) answers first that it is region_1: it is
    refused with both fingerprints named, and region_1 is reached through its own node."""
    grid = NodesGrid(
        {
            99: (pki.public["region_3"], "region_1"),
            11: (pki.public["region_0"], "region_0"),
            12: (pki.public["region_1"], "region_1"),
        }
    )
    coordinator = link(grid, pki)
    assert coordinator.discover(["region_0", "region_1"]) == {"region_0": 11, "region_1": 12}
    (refused,) = coordinator.claims.refused
    impostor, real = fingerprint(pki.public["region_3"]), fingerprint(pki.public["region_1"])
    assert (refused["site"], refused["node"]) == ("region_1", "99")
    assert (refused["fingerprint"], refused["enrolled_fingerprint"]) == (impostor, real)
    assert impostor in refused["reason"] and real in refused["reason"]
    assert "enrolled for site 'region_3'" in refused["reason"]
    record = coordinator.claims.record()
    assert record["sites"]["region_1"] == {"node": "12", "fingerprint": real, "enrolled": True}


def test_a_late_impostor_is_seen_and_refused_after_every_site_was_found(pki) -> None:
    """The real sites answer first; the impostor's later claim is still read (identify_grace)."""
    grid = NodesGrid(
        {
            11: (pki.public["region_0"], "region_0"),
            12: (pki.public["region_1"], "region_1"),
            99: (pki.public["region_3"], "region_1"),
        }
    )
    coordinator = link(grid, pki)
    assert coordinator.discover(["region_0", "region_1"])["region_1"] == 12
    assert [r["node"] for r in coordinator.claims.refused] == ["99"]


class SilentGrid(NodesGrid):
    """A grid whose node 98 is online but never answers ``query.identify``."""

    def pull_messages(self, message_ids) -> list[Reply]:
        return super().pull_messages([m for m in message_ids if self.pending.get(m) != 98])


def test_discovery_waits_no_grace_once_every_online_node_has_answered(pki) -> None:
    """identify_grace is a wait for nodes that have not answered yet, not a pause added to
    every study: with every node's answer in, discovery returns at once."""
    grid = NodesGrid(
        {11: (pki.public["region_0"], "region_0"), 12: (pki.public["region_1"], "region_1")}
    )
    coordinator = link(grid, pki, identify_grace=30.0, discovery_timeout=60.0)
    started = time.monotonic()
    assert coordinator.discover(["region_0", "region_1"]) == {"region_0": 11, "region_1": 12}
    assert time.monotonic() - started < 5.0


def test_a_node_that_never_answers_delays_discovery_by_the_grace_only(pki) -> None:
    grid = SilentGrid(
        {98: (pki.public["region_3"], "region_1"), 11: (pki.public["region_0"], "region_0")}
    )
    coordinator = link(grid, pki, identify_grace=0.5, discovery_timeout=60.0)
    started = time.monotonic()
    assert coordinator.discover(["region_0"]) == {"region_0": 11}
    assert 0.5 <= time.monotonic() - started < 10.0


def test_an_impostor_alone_is_never_served_and_the_site_is_named_missing(pki) -> None:
    grid = NodesGrid(
        {11: (pki.public["region_0"], "region_0"), 99: (pki.public["region_3"], "region_1")}
    )
    coordinator = link(grid, pki)
    with pytest.raises(SitesMissingError, match=r"\['region_1'\].*refused"):
        coordinator.discover(["region_0", "region_1"])
    assert "region_1" not in coordinator.nodes


def test_a_node_with_an_unenrolled_key_or_no_key_is_refused(pki) -> None:
    stranger = ec.generate_private_key(ec.SECP256R1()).public_key()
    grid = NodesGrid(
        {
            98: (stranger, "region_0"),
            97: (None, "region_0"),
            11: (pki.public["region_0"], "region_0"),
        }
    )
    coordinator = link(grid, pki)
    assert coordinator.discover(["region_0"]) == {"region_0": 11}
    reasons = {r["node"]: r["reason"] for r in coordinator.claims.refused}
    assert "not enrolled for any site" in reasons["98"] and fingerprint(stranger) in reasons["98"]
    assert "key no key" in reasons["97"]


class RawKeyGrid(NodesGrid):
    """A grid whose node 98 reports ``raw`` as its public key (what the SuperLink stored)."""

    def __init__(self, nodes, raw: bytes) -> None:
        super().__init__(nodes)
        self.raw = raw

    def get_nodes(self) -> list[NodeInfo]:
        infos = super().get_nodes()
        for info in infos:
            if info.node_id == 98:
                info.public_key = self.raw
        return infos


@settings(max_examples=40, deadline=None)
@given(raw=st.binary(max_size=300))
def test_any_key_bytes_a_node_reports_are_refused_unless_enrolled(pki, raw: bytes) -> None:
    """Whatever bytes stand for node 98's key, it is not served as region_0 (typed refusal)."""
    grid = RawKeyGrid({98: (None, "region_0"), 11: (pki.public["region_0"], "region_0")}, raw)
    coordinator = link(grid, pki)
    assert coordinator.discover(["region_0"]) == {"region_0": 11}
    assert [r["node"] for r in coordinator.claims.refused] == ["98"]


@pytest.mark.parametrize("form", ["rsa", "ed25519", "truncated", "openssh-of-another"])
def test_a_node_reporting_malformed_or_foreign_key_bytes_is_refused(pki, form) -> None:
    """Node 98 claims region_0 with key bytes that are not region_0's EC key: an RSA or
    Ed25519 key, region_0's own PEM cut short, or another party's key in OpenSSH form.
    It is refused, and region_0 is reached through its own node."""
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    raw = {
        "rsa": lambda: rsa.generate_private_key(65537, 2048).public_key().public_bytes(*pem),
        "ed25519": lambda: ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(*pem),
        "truncated": lambda: pki.public["region_0"].public_bytes(*pem)[:-40],
        "openssh-of-another": lambda: key_line(pki.public["region_3"]).encode(),
    }[form]()
    grid = RawKeyGrid({98: (None, "region_0"), 11: (pki.public["region_0"], "region_0")}, raw)
    coordinator = link(grid, pki)
    assert coordinator.discover(["region_0"]) == {"region_0": 11}
    (refused,) = coordinator.claims.refused
    assert refused["node"] == "98"
    assert refused["enrolled_fingerprint"] == fingerprint(pki.public["region_0"])


class GarbledGrid(NodesGrid):
    """A grid whose node 98 answers ``query.identify`` with ``content`` (no readable name)."""

    def __init__(self, nodes, content) -> None:
        super().__init__(nodes)
        self.content = content
        self.garbled: set[str] = set()

    def pull_messages(self, message_ids) -> list[Reply]:
        replies = super().pull_messages(message_ids)
        for reply in replies:
            if reply.metadata.reply_to_message_id in self.garbled:
                reply.content = self.content
        return replies

    def push_messages(self, outgoing) -> list[str]:
        ids = super().push_messages(outgoing)
        self.garbled |= {
            m
            for m, message in zip(ids, outgoing, strict=True)
            if message.metadata.dst_node_id == 98
        }
        return ids


@pytest.mark.parametrize(
    "content",
    [
        messages.identity(""),
        RecordDict(),
        RecordDict({messages.RECORD: ConfigRecord({messages.SITE: 7})}),
    ],
    ids=["empty-name", "no-record", "number"],
)
def test_a_registered_node_answering_identify_with_no_readable_name_stops_no_study(
    pki, content
) -> None:
    """Any registered node may be asked who it is (even one of another study): an answer
    that carries no site name is not a claim, and discovery goes on with the real sites."""
    grid = GarbledGrid(
        {98: (pki.public["region_3"], "region_0"), 11: (pki.public["region_0"], "region_0")},
        content,
    )
    coordinator = link(grid, pki)
    assert coordinator.discover(["region_0"]) == {"region_0": 11}
    assert coordinator.claims.refused == []


def test_two_nodes_claiming_one_name_without_an_enrolment_list_are_both_refused() -> None:
    """Without an enrolment list nothing tells which node is region_1: a typed error names
    the site and both nodes and keys, and region_1 is served by neither."""
    keys = [ec.generate_private_key(ec.SECP256R1()).public_key() for _ in range(2)]
    grid = NodesGrid({12: (keys[0], "region_1"), 99: (keys[1], "region_1")})
    coordinator = link(grid, None)
    with pytest.raises(SiteIdentityError, match="two nodes claim site 'region_1'") as raised:
        coordinator.discover(["region_1"])
    for item in ("node 12", "node 99", fingerprint(keys[0]), fingerprint(keys[1])):
        assert item in str(raised.value)
    assert "region_1" not in coordinator.nodes


def test_a_study_site_missing_from_the_enrolment_is_refused_before_discovery(pki, tmp_path):
    from fedstats.flower_apps.coordinator_app import load_enrolment
    from fedstats.jobs.study_config import StudyConfig

    config = StudyConfig.model_validate(
        {
            "study": {"name": STUDY, "sites": ["region_0", "region_2"], "out": str(tmp_path)},
            "identity": {"enrolment": str(pki.enrolment), "study_ca": str(pki.ca.certificate)},
            "fits": [{"kind": "logistic", "name": "f", "formula": "y ~ x"}],
        }
    )
    with pytest.raises(EnrolmentError, match="site 'region_2' is not enrolled"):
        load_enrolment(config)


# -- the enrolment file -------------------------------------------------------------------


def test_a_tampered_enrolment_is_refused(pki, tmp_path: Path) -> None:
    """Swapping region_1's key for the impostor's (signature kept) breaks the CA signature."""
    text = pki.enrolment.read_text()
    forged = text.replace(key_line(pki.public["region_1"]), "SWAP").replace(
        key_line(pki.public["region_3"]), key_line(pki.public["region_1"])
    )
    forged = forged.replace("SWAP", key_line(pki.public["region_3"]))
    assert forged != text
    path = tmp_path / "enrolment.toml"
    path.write_text(forged)
    with pytest.raises(EnrolmentError, match="the study CA did not sign these bindings"):
        read_enrolment(path, pki.ca.certificate)


def test_an_enrolment_signed_by_another_ca_or_for_another_study_is_refused(pki, tmp_path):
    other = study_pki.make_study_ca(tmp_path / "other", STUDY)
    with pytest.raises(EnrolmentError, match="did not sign"):
        read_enrolment(pki.enrolment, other.certificate)
    with pytest.raises(EnrolmentError, match="field 'study'"):
        read_enrolment(pki.enrolment, pki.ca.certificate, study="another-study")


def test_one_key_cannot_be_enrolled_for_two_sites(pki, tmp_path: Path) -> None:
    ca_key = serialization.load_pem_private_key(pki.ca.key.read_bytes(), None)
    line = pki.keys["region_0"].public_key.read_text()
    with pytest.raises(EnrolmentError, match="enrolled for both 'a' and 'b'"):
        write_enrolment(tmp_path / "e.toml", STUDY, {"a": line, "b": line}, ca_key)


def test_a_signed_list_enrolling_one_key_under_two_names_is_refused_when_read(pki, tmp_path):
    """Signed by the study CA itself (not through write_enrolment): a node holding that key
    could claim either name, so the list is refused by whoever reads it."""
    line = key_line(pki.public["region_3"])
    path = signed_list(tmp_path / "e.toml", pki, STUDY, [("region_1", line), ("region_3", line)])
    with pytest.raises(EnrolmentError, match="enrolled for both 'region_1' and 'region_3'"):
        read_enrolment(path, pki.ca.certificate, study=STUDY)


def test_a_list_validly_signed_by_another_studys_ca_is_refused_by_coordinator_and_site(
    pki, tmp_path
) -> None:
    """Another study's CA (same study name, a valid signature of its own) binds region_1 to
    region_3's key: the coordinator and region_3's node both refuse it (this study's CA)."""
    other = study_pki.make_study_ca(tmp_path / "other", STUDY)
    other_key = serialization.load_pem_private_key(other.key.read_bytes(), None)
    forged = [("region_1", key_line(pki.public["region_3"]))]
    path = signed_list(tmp_path / "forged.toml", pki, STUDY, forged, ca_key=other_key)
    assert read_enrolment(path, other.certificate).fingerprint("region_1") == fingerprint(
        pki.public["region_3"]
    )  # the signature is valid, for the other CA
    with pytest.raises(EnrolmentError, match="did not sign"):
        read_enrolment(path, pki.ca.certificate, study=STUDY)
    site = site_toml(tmp_path, pki, "region_1", key_of="region_3")
    site.write_text(site.read_text().replace(str(pki.enrolment), str(path)))
    with pytest.raises(EnrolmentError, match="did not sign"):
        check_site_identity(load_site_config(site))


def signed_list(path: Path, pki, study: str, sites: list[tuple[str, str]], ca_key=None) -> Path:
    """An enrolment file binding ``sites`` (name, key line), validly signed by ``ca_key`` (by
    default the study CA's): what a CA holder can write, whatever ``write_enrolment`` allows."""
    if ca_key is None:
        ca_key = serialization.load_pem_private_key(pki.ca.key.read_bytes(), None)
    canonical = sorted(sites)
    message = json.dumps(
        [ENROLMENT_VERSION, study, [list(item) for item in canonical]], separators=(",", ":")
    ).encode()
    signature = ca_key.sign(message, ec.ECDSA(hashes.SHA256())).hex()
    lines = ["[enrolment]", f"study = {json.dumps(study)}", f'signature = "{signature}"', ""]
    lines += ["[enrolment.sites]"] + [f"{json.dumps(s)} = {json.dumps(k)}" for s, k in sites]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("name", ["..", ".hidden", "-x", "a" * 101])
def test_a_signed_enrolment_naming_a_site_no_configuration_accepts_is_refused(
    pki, tmp_path, name
) -> None:
    """The list accepts exactly the names site.toml and study.toml accept
    (:mod:`studyfiles.names`): ``..`` or a 101-letter name, even validly signed, is refused."""
    line = key_line(pki.public["region_0"])
    path = signed_list(tmp_path / "e.toml", pki, STUDY, [(name, line)])
    with pytest.raises(EnrolmentError, match="site name"):
        read_enrolment(path, pki.ca.certificate)
    ca_key = serialization.load_pem_private_key(pki.ca.key.read_bytes(), None)
    with pytest.raises(EnrolmentError, match="site name"):
        write_enrolment(tmp_path / "w.toml", STUDY, {name: line}, ca_key)


def test_the_enrolment_command_prints_ssh_keygen_fingerprints(pki, tmp_path, capsys) -> None:
    out = tmp_path / "enrolment.toml"
    study_pki.main(
        ["enrol", "--out", str(out), "--ca", str(pki.root), "--study", STUDY]
        + [f"--node={s}={pki.keys[s].public_key}" for s in SITES]
    )
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines()[1:])
    assert printed == {s: fingerprint(pki.public[s]) for s in SITES}
    if shutil.which("ssh-keygen"):
        shown = subprocess.run(
            ["ssh-keygen", "-lf", str(pki.keys["region_1"].public_key)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[1]
        assert shown == printed["region_1"]
    with pytest.raises(SystemExit):  # never overwritten
        study_pki.main(["enrol", "--out", str(out), "--ca", str(pki.root), "--study", STUDY])


def test_enrolling_with_a_ca_key_that_is_not_the_certificates_writes_no_list(pki, tmp_path):
    """A CA folder whose key is not its certificate's (another CA's key copied in) would sign a
    list no party can verify: the command refuses before writing, so the officer can rerun it."""
    other = study_pki.make_study_ca(tmp_path / "other", STUDY)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(pki.ca.certificate, mixed / "study-ca.crt")
    shutil.copy(other.key, mixed / "study-ca.key")
    out = tmp_path / "enrolment.toml"
    argv = ["enrol", "--out", str(out), "--ca", str(mixed), "--study", STUDY]
    argv += [f"--node={s}={pki.keys[s].public_key}" for s in SITES]
    with pytest.raises(SystemExit):
        study_pki.main(argv)
    assert not out.exists()


FIELD_VALUES = st.one_of(
    st.text(max_size=80),
    st.integers(),
    st.booleans(),
    st.lists(st.text(max_size=10), max_size=3),
    st.dictionaries(st.text(max_size=10), st.text(max_size=80), max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(["study", "signature", "sites", "site name", "site key", "extra"]),
    value=FIELD_VALUES,
)
def test_any_change_to_an_enrolment_field_is_refused_with_a_typed_error(pki, field, value):
    """Whatever a field is changed to, the list is refused with :class:`EnrolmentError`
    naming the file, or (the change kept the signed bindings) reads back the same."""
    import tomli_w

    document = tomllib.loads(pki.enrolment.read_text())
    table = document["enrolment"]
    if field == "site name":
        if not isinstance(value, str):
            return
        table["sites"] = {value if k == "region_1" else k: v for k, v in table["sites"].items()}
    elif field == "site key":
        table["sites"]["region_1"] = value
    elif field == "extra":
        table["extra"] = value
    else:
        table[field] = value
    path = pki.root / "mutated.toml"
    path.write_text(tomli_w.dumps(document))
    try:
        read = read_enrolment(path, pki.ca.certificate)
    except EnrolmentError as error:
        assert str(path) in str(error)
        return
    original = read_enrolment(pki.enrolment, pki.ca.certificate)
    assert read.study == original.study and read.fingerprints() == original.fingerprints()


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=400))
def test_any_enrolment_text_is_read_or_refused_with_a_typed_error(pki, text) -> None:
    path = pki.root / "arbitrary.toml"
    path.write_text(text)
    with pytest.raises(EnrolmentError):
        read_enrolment(path, pki.ca.certificate)


# -- the site -------------------------------------------------------------------------------


def site_toml(tmp_path: Path, pki, name: str, key_of: str, *, enrolment: bool = True) -> Path:
    """A site.toml named ``name`` whose SuperNode key is ``key_of``'s node key."""
    frame = datasets.tcga_brca().frames["region_1"]
    path = write_site(
        tmp_path,
        name,
        frame,
        "127.0.0.1:9092",
        root_certificates=pki.ca.certificate,
        auth_private_key=pki.keys[key_of].private_key,
    )
    if enrolment:
        text = path.read_text().replace(
            "auth_private_key =", f'enrolment = "{pki.enrolment}"\nauth_private_key ='
        )
        path.write_text(text)
    return path


def test_a_node_with_the_studys_files_and_another_key_cannot_start_as_region_1(pki, tmp_path):
    """region_3's node configured as region_1 with the study's enrolment: it refuses to serve
    (the ClientApp builds no service), and ``fedstats site run`` stops at configuration."""
    path = site_toml(tmp_path, pki, "region_1", key_of="region_3")
    impostor, real = fingerprint(pki.public["region_3"]), fingerprint(pki.public["region_1"])
    with pytest.raises(EnrolmentError, match=re.escape(impostor)) as raised:
        check_site_identity(load_site_config(path))
    assert real in str(raised.value) and "site 'region_1'" in str(raised.value)
    with pytest.raises(EnrolmentError):
        SiteService(load_site_config(path))
    with pytest.raises(ConfigError, match=re.escape("field 'coordinator.enrolment'")):
        load_job_config(path)


def test_a_site_whose_name_is_not_enrolled_does_not_take_part(pki, tmp_path) -> None:
    path = site_toml(tmp_path, pki, "region_2", key_of="region_3")
    with pytest.raises(EnrolmentError, match="site 'region_2' is not enrolled"):
        SiteService(load_site_config(path))


def test_an_enrolled_site_serves_with_its_own_key(pki, tmp_path) -> None:
    path = site_toml(tmp_path, pki, "region_1", key_of="region_1")
    service = SiteService(load_site_config(path))
    assert service.node_key_fingerprint == fingerprint(pki.public["region_1"])
    service.close()


def test_an_enrolment_without_a_node_key_is_a_configuration_error(pki, tmp_path) -> None:
    path = site_toml(tmp_path, pki, "region_1", key_of="region_1")
    path.write_text(re.sub(r"auth_private_key = .*\n", "", path.read_text()))
    with pytest.raises(ConfigError, match="auth_private_key"):
        load_site_config(path)


def test_a_claim_repeated_at_every_discovery_poll_is_recorded_once():
    """A slow study polls the grid several times while an impostor keeps answering: the
    report lists its refused claim once, not once per poll."""
    from fedstats.flower.site_claims import SiteClaims

    claims = SiteClaims(enrolment=None)
    claims.admit("region_1", 5, None)
    for _ in range(3):
        with pytest.raises(SiteIdentityError):
            claims.admit("region_1", 9, None)
    assert len(claims.record()["refused"]) == 1
