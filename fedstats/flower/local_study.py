"""A study on one machine: a SuperLink and a SuperNode per site, separate processes on loopback.

For tests, benchmarks and trying a deployment out: every site gets a folder
with its frame and site.toml, the coordinator a study.toml, and every process
its own ``FLWR_HOME``. :meth:`LocalStudy.close` stops every process started.

``LocalStudy(root, simulation=True)`` runs the same study on Flower's
simulation engine instead: one SuperLink with ``--simulation``, whose
``flwr-simulation`` runs each site's ClientApp on a virtual SuperNode (a Ray
actor; :data:`SIMULATION_FEDERATION`), for 10 to 100 sites on one machine. The
ServerApp, the ClientApp, the site code, codec and boundary rules are those
of a deployment; only the transport differs.

``LocalStudy(root, tls=True)`` makes a study CA and a SuperLink certificate
for 127.0.0.1 (:mod:`fedstats.flower.study_pki`, under ``root/pki``) and runs
every connection over TLS; ``node_auth=True`` adds SuperNode authentication:
each site gets its own node key, registered with the SuperLink before its
SuperNode starts; ``enrol=True`` adds the study's enrolment list binding each
site's name to its node key (:mod:`fedstats.flower.enrolment`).
"""

from __future__ import annotations

import json
import subprocess
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedstats.errors import ConfigError, FlowerProcessError
from fedstats.flower import processes, study_pki
from fedstats.secagg.roster import write_roster

STUDY_TEMPLATE = """
[study]
name = "{name}"
sites = {sites}
out = "{out}"

[policy]
round_timeout = {round_timeout}
on_site_lost = "{on_site_lost}"
retries = {retries}
discovery_timeout = {discovery_timeout}
poll_interval = 0.005
identify_grace = {identify_grace}
{identity}
{fits}
"""
STUDY_NAME = "flower-bench"
ENROLMENT_FILE = "enrolment.toml"
SIMULATED_SITES_FILE = "simulated-sites.toml"
SIMULATION_FEDERATION: dict[str, int | bool] = {
    "client-resources-num-cpus": 1,
    "init-args-num-cpus": 1,
    "init-args-log-to-driver": False,
}
"""Ray resources of a simulated study: one CPU for the ClientApps and one per ClientApp, so
one actor process serves every site in turn and keeps each site's state (its ledger, journal
and open secure-aggregation sessions) as a SuperNode's long-lived worker does."""

SITE_TEMPLATE = """
[site]
name = "{claims}"
workdir = "{workdir}"

[data]
frame = "{frame}"

[privacy]
ledger = "{ledger}"

[coordinator]
superlink = "{superlink}"
{connection}
"""


def write_site(
    root: Path,
    name: str,
    frame: pd.DataFrame,
    superlink: str,
    *,
    root_certificates: Path | None = None,
    auth_private_key: Path | None = None,
    enrolment: Path | None = None,
    claims: str | None = None,
    roster: Path | None = None,
    signing_key: Path | None = None,
) -> Path:
    """A site folder with its frame and site.toml; returns the site.toml path.

    Without ``root_certificates`` (the study CA) the site connects insecurely.
    ``enrolment``: the study's enrolment list the site checks its own key
    against. ``claims``: the site name its site.toml gives, when not ``name``
    (the folder's name): a node of another party posing as a study site.
    ``roster`` and ``signing_key``: the study's roster and the site's key, pinned in
    ``[secure_aggregation]``, with ``[disclosure] verified_paths = true``: the site answers
    exact iterative fits only on verified paths (:mod:`fedstats.site.verified_paths`).
    """
    if root_certificates is None:
        connection = "insecure = true"
    else:
        connection = f'root_certificates = "{root_certificates}"'
        if auth_private_key is not None:
            connection += f'\nauth_private_key = "{auth_private_key}"'
        if enrolment is not None:
            connection += f'\nenrolment = "{enrolment}"'
    folder = root / "sites" / name
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(folder / "frame.parquet")
    path = folder / "site.toml"
    text = SITE_TEMPLATE.format(
        claims=claims or name,
        workdir=folder / "work",
        frame=folder / "frame.parquet",
        ledger=folder / "site.ledger",
        superlink=superlink,
        connection=connection,
    )
    if roster is not None and signing_key is not None:
        text += (
            "\n[disclosure]\nverified_paths = true\n\n"
            f'[secure_aggregation]\nroster = "{roster}"\nsigning_key = "{signing_key}"\n'
        )
    else:  # a test bench without the study's roster: the site says it does not verify
        text += "\n[disclosure]\nverified_paths = false\n"
    path.write_text(text, encoding="utf-8")
    return path


def write_simulated_sites(path: Path, site_configs: Sequence[Path]) -> Path:
    """The file naming each virtual SuperNode's site.toml, in partition order."""
    lines = ["# site.toml of each partition of a simulated study, in order", "sites = ["]
    lines += [f"    {json.dumps(str(Path(config).resolve()))}," for config in site_configs]
    path.write_text("\n".join([*lines, "]", ""]), encoding="utf-8")
    return path


def simulated_site(listing: Path, partition: int) -> Path:
    """The site.toml of ``partition`` in a :func:`write_simulated_sites` file."""
    try:
        sites = tomllib.loads(listing.read_text(encoding="utf-8"))["sites"]
        return Path(sites[partition])
    except (OSError, tomllib.TOMLDecodeError, KeyError, IndexError, TypeError) as error:
        raise ConfigError(
            f"{listing}: no site.toml for simulated partition {partition} ({error}); "
            "write the file with fedstats.flower.local_study.write_simulated_sites"
        ) from None


def write_study(
    root: Path,
    sites: list[str],
    fits: str,
    *,
    out: Path,
    round_timeout: float = 30,
    on_site_lost: str = "abort",
    retries: int = 0,
    discovery_timeout: float = 60,
    identify_grace: float = 2.0,
    identity: tuple[Path, Path] | None = None,
) -> Path:
    """The coordinator's study.toml for ``sites`` and the ``[[fits]]`` text ``fits``.

    ``identity``: the enrolment list and the study CA (``[identity]``), e.g.
    :attr:`LocalStudy.identity`.
    """
    section = ""
    if identity is not None:
        section = f'[identity]\nenrolment = "{identity[0]}"\nstudy_ca = "{identity[1]}"\n'

    path = root / f"study-{out.name}.toml"
    path.write_text(
        STUDY_TEMPLATE.format(
            name=STUDY_NAME,
            sites=json.dumps(sites),
            out=out,
            round_timeout=round_timeout,
            on_site_lost=on_site_lost,
            retries=retries,
            discovery_timeout=discovery_timeout,
            identify_grace=identify_grace,
            identity=section,
            fits=fits,
        ),
        encoding="utf-8",
    )
    return path


@dataclass
class LocalStudy:
    """The processes of a local study; :meth:`close` stops every one of them.

    Parameters
    ----------
    root:
        The folder of everything: sites, PKI, every process's ``FLWR_HOME``.
    long_lived:
        Sites run the long-lived ClientApp runner (see
        :func:`~fedstats.flower.processes.start_supernode`).
    tls:
        Every connection over TLS with a study CA made under ``root/pki``.
    node_auth:
        SuperNode authentication (needs ``tls``): only nodes whose key was
        registered with the SuperLink are served.
    enrol:
        Sites' names bound to their node keys (needs ``node_auth``): an
        enrolment list signed by the study CA (``root/pki/enrolment.toml``)
        over every site of :meth:`start` and its ``parties``; each site.toml
        names it, and :attr:`identity` is the coordinator's ``[identity]``.
    simulation:
        Run on Flower's simulation engine (module docstring): no SuperNode
        processes; every run's virtual SuperNodes serve the sites of
        :meth:`start`, in order. Excludes ``tls`` and ``node_auth``.
    verified_paths:
        Every site of :meth:`start` pins the study's roster of node keys
        (``root/pki/roster.toml``) and answers exact iterative fits only on
        verified paths (the default, as ``fedstats site run`` requires; ``False`` for a
        bench of sites that say they do not verify).
    """

    root: Path
    port: int = 0
    superlink: subprocess.Popen | None = None
    nodes: dict[str, list[subprocess.Popen]] = field(default_factory=dict)
    site_configs: dict[str, Path] = field(default_factory=dict)
    stopped: list[subprocess.Popen] = field(default_factory=list)
    long_lived: bool = True
    tls: bool = False
    node_auth: bool = False
    enrol: bool = False
    verified_paths: bool = True
    simulation: bool = False
    roster: Path | None = None
    ca: study_pki.StudyCa | None = None
    enrolment: Path | None = None
    node_keys: dict[str, study_pki.NodeKey] = field(default_factory=dict)
    registered: dict[str, int] = field(default_factory=dict)
    """Node id the SuperLink gave each registered site's key."""
    rostered: set[str] = field(default_factory=set)
    """The sites the study's roster lists (those of :meth:`start`, with ``verified_paths``)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def user_home(self) -> Path:
        """The ``FLWR_HOME`` of the coordinator's ``flwr`` commands (run, register)."""
        return self.root / "user"

    @property
    def identity(self) -> tuple[Path, Path] | None:
        """The coordinator's ``[identity]``: (enrolment list, study CA), or ``None``."""
        if self.enrolment is None or self.ca is None:
            return None
        return self.enrolment, self.ca.certificate

    def start(self, frames: dict[str, pd.DataFrame], parties: Sequence[str] = ()) -> LocalStudy:
        """Start the SuperLink, then add every site of ``frames`` (registered, trusted).

        With ``enrol``, every site of ``frames`` and every one of ``parties``
        (enrolled parties whose nodes :meth:`add_site` starts later) gets its
        node key first, and the enrolment list binds each name to its key.
        """
        if self.node_auth and not self.tls:
            raise FlowerProcessError(
                "SuperNode authentication needs TLS: LocalStudy(root, tls=True, node_auth=True)"
            )
        if self.enrol and not self.node_auth:
            raise FlowerProcessError(
                "enrolment binds names to node keys: LocalStudy(root, tls=True, node_auth=True, "
                "enrol=True)"
            )
        if self.simulation and (self.tls or self.node_auth):
            raise FlowerProcessError(
                "Flower's simulation engine has no network between its nodes: "
                "LocalStudy(root, simulation=True) without tls or node_auth"
            )
        self.port = processes.free_port()
        tls = None
        if self.tls:
            pki = self.root / "pki"
            self.ca = study_pki.make_study_ca(pki, "local-study")
            server = study_pki.make_server_certificate(pki, self.ca, ["127.0.0.1", "localhost"])
            tls = processes.Tls(self.ca.certificate, server.certificate, server.key)
        self.superlink = processes.start_superlink(
            self.root / "link",
            self.port,
            tls=tls,
            node_auth=self.node_auth,
            simulation=self.simulation,
        )
        processes.wait_for_port(self.port, 60, self.superlink)
        processes.write_connection(
            self.user_home, self.address, ca=None if self.ca is None else self.ca.certificate
        )
        if self.enrol and self.ca is not None:
            keys = {name: self._node_key(name) for name in [*frames, *parties]}
            self.enrolment = self.root / "pki" / ENROLMENT_FILE
            study_pki.enrol_sites(
                self.enrolment,
                self.ca,
                STUDY_NAME,
                {name: key.public_key.read_text(encoding="utf-8") for name, key in keys.items()},
            )
        if self.verified_paths:
            keys = {name: self._node_key(name) for name in frames}
            self.rostered = set(frames)
            (self.root / "pki").mkdir(parents=True, exist_ok=True)
            self.roster = write_roster(
                self.root / "pki" / "roster.toml",
                STUDY_NAME,
                {name: key.public_key.read_text(encoding="utf-8") for name, key in keys.items()},
            )
        for name, frame in frames.items():
            self.add_site(name, frame)
        return self

    def add_site(
        self,
        name: str,
        frame: pd.DataFrame,
        *,
        registered: bool = True,
        trusted: bool = True,
        claims: str | None = None,
        checks_enrolment: bool = True,
    ) -> None:
        """Write a site's folder and start its SuperNode.

        With ``node_auth`` the site gets a node key of its own, registered with
        the SuperLink unless ``registered=False`` (an unknown node, which the
        SuperLink refuses). ``trusted=False`` starts the node without the
        study CA (it then trusts only the system's certificates).
        ``claims``: the site name its site.toml gives instead of ``name``;
        ``checks_enrolment=False``: its site.toml does not name the enrolment
        list (a node of another party that does not check its own binding).
        """
        key = None
        if self.node_auth:
            key = self._node_key(name)
            if registered:
                self.registered[name] = processes.register_node(
                    self.user_home, key.public_key, name=name
                )
        # the roster lists the sites of start() under their own names; a node added later, or
        # one claiming another site's name, is not on it and says it does not verify paths
        roster = self.roster if name in self.rostered and claims in (None, name) else None
        self.site_configs[name] = write_site(
            self.root,
            name,
            frame,
            self.address,
            root_certificates=None if self.ca is None else self.ca.certificate,
            auth_private_key=None if key is None else key.private_key,
            enrolment=self.enrolment if checks_enrolment else None,
            claims=claims,
            roster=roster,
            signing_key=None if roster is None else self._node_key(name).private_key,
        )
        self.start_node(name, trusted=trusted)

    def _node_key(self, name: str) -> study_pki.NodeKey:
        """The node key of ``name`` (made once)."""
        if name not in self.node_keys:
            self.node_keys[name] = study_pki.make_node_key(self.root / "sites" / name / "pki", name)
        return self.node_keys[name]

    def start_node(self, name: str, *, trusted: bool = True) -> None:
        """Start (or restart) the SuperNode of a site already added (under the simulation
        engine, the run's virtual SuperNodes serve it: nothing to start)."""
        if self.simulation:
            return
        ca = None
        if self.ca is not None and trusted:
            ca = self.ca.certificate
        key = self.node_keys.get(name) if self.node_auth else None  # else it only signs replies
        self.nodes[name] = processes.start_supernode(
            self.root / "nodes" / f"{name}-{time.monotonic_ns()}",
            self.address,
            processes.free_port(),
            self.site_configs[name],
            long_lived=self.long_lived,
            ca=ca,
            auth_private_key=None if key is None else key.private_key,
            insecure=not self.tls,
        )

    def wait_online(self, names: Sequence[str], timeout: float = 120) -> None:
        """Wait until the registered nodes of ``names`` are online at the SuperLink."""
        wanted = {self.registered[name] for name in names}
        deadline = time.monotonic() + timeout
        while not wanted <= processes.online_nodes(self.user_home):
            if time.monotonic() > deadline:
                raise FlowerProcessError(
                    f"nodes of {list(names)} not online within {timeout:g} s: {self.logs()}"
                )
            time.sleep(0.5)

    def kill_node(self, name: str) -> None:
        for process in self.nodes.pop(name):
            processes.kill(process)
            self.stopped.append(process)

    def run(self, study: Path, out: Path, timeout: float = 600) -> dict:
        """Submit the study and wait for its status.json to say completed or failed."""
        status_path = out / "status.json"
        status_path.unlink(missing_ok=True)
        run_config, federation = None, None
        if self.simulation:
            listing = write_simulated_sites(
                self.root / SIMULATED_SITES_FILE, list(self.site_configs.values())
            )
            run_config = {"simulated-sites": str(listing)}
            federation = {"num-supernodes": len(self.site_configs), **SIMULATION_FEDERATION}
        run_id = processes.submit_run(
            self.user_home, study, run_config=run_config, federation=federation
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if status_path.is_file():
                status = json.loads(status_path.read_text())
                if status.get("run_id") == run_id and status["status"] != "running":
                    return status
            if self.superlink is not None and self.superlink.poll() is not None:
                raise FlowerProcessError(f"the SuperLink exited: {self.logs()}")
            time.sleep(0.1)
        raise FlowerProcessError(f"run {run_id} did not finish within {timeout} s: {self.logs()}")

    def logs(self) -> str:
        parts = []
        for log in sorted(self.root.rglob("*.log")):
            parts.append(f"--- {log}\n" + log.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def all_processes(self) -> list[subprocess.Popen]:
        nodes = [p for group in self.nodes.values() for p in group]
        return [p for p in [self.superlink, *nodes] if p is not None]

    def close(self) -> None:
        processes.stop(self.all_processes())
