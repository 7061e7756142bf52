"""The README's deployment guide, run as written: every ``deploy`` block, on loopback.

README.md's "Deploying a study step by step" marks its commands with fenced
blocks whose info string is ``bash deploy coordinator``, ``bash deploy site``
or ``toml deploy flwr-config``. This test runs them in document order — the
coordinator's as they are, the sites' once per site — changing only what a
real deployment changes: ``/etc/fedstats/`` becomes each machine's temporary
folder, ``coordinator.example.org`` becomes 127.0.0.1, and the ports become
free ones. Commands ending in ``&`` are started in the background (and all
stopped at the end); the others must succeed. Files that travel between the
machines in the guide (``node.pub`` to the coordinator, ``study-ca.crt`` and,
when the guide enrols the sites, ``enrolment.toml`` to the sites) are copied,
and each site's ``site.toml`` and the coordinator's ``study.toml`` are written
as the guide describes them. The last command,
``fedstats study run``, must finish the study: every fit recorded, the
compliance report written, and the fit equal to the embedded runtime's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tomli_w

from fedstats import Federation, LogisticRegression
from fedstats.flower import processes

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SITES = ["region_0", "region_1"]
FORMULA = "y ~ age + x"
BLOCK = re.compile(r"^```(bash|toml) deploy ([\w-]+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
GUIDE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def guide_blocks() -> list[tuple[str, str, str]]:
    """(language, role, text) of every deploy block of the README, in order."""
    return [match.groups() for match in BLOCK.finditer(README.read_text(encoding="utf-8"))]


def commands(text: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


@dataclass
class Machine:
    """One machine of the guide: its /etc/fedstats/ folder and substitutions."""

    root: Path
    replacements: dict[str, str]
    homes: int = 0
    background: list[subprocess.Popen] = field(default_factory=list)

    def text(self, text: str) -> str:
        for old, new in self.replacements.items():
            text = text.replace(old, new)
        return text

    def env(self, home: Path) -> dict[str, str]:
        environment = dict(os.environ)
        environment.update(GUIDE_ENV)
        environment["FLWR_HOME"] = str(home)
        environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        return environment

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess | None:
        """Run one of the guide's commands here (a ``&`` command in the background)."""
        command = self.text(command)
        background = command.endswith("&")
        argv = shlex.split(command.rstrip("&").strip())
        if background:
            self.homes += 1
            home = self.root / "flwr-homes" / f"{self.homes}-{Path(argv[0]).name}"
            home.mkdir(parents=True)
            log = (home / "output.log").open("ab")
            self.background.append(
                subprocess.Popen(
                    argv,
                    cwd=self.root,
                    env=self.env(home),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            return None
        done = subprocess.run(
            argv,
            cwd=self.root,
            env=self.env(self.root / "flwr-home"),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
        return done

    def logs(self) -> str:
        return "\n".join(
            f"--- {log}\n{log.read_text(errors='replace')[-2000:]}"
            for log in sorted(self.root.glob("flwr-homes/*/output.log"))
        )


def site_frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(11)
    frames = {}
    for index, site in enumerate(SITES):
        n = 150 + 40 * index
        age = rng.normal(60, 10, n)
        x = rng.normal(0, 1, n)
        y = (rng.random(n) < 1 / (1 + np.exp(-(-3 + 0.05 * age + 0.5 * x)))).astype(int)
        frames[site] = pd.DataFrame({"y": y, "age": age, "x": x})
    return frames


ENROLMENT = "enrolment.toml"
"""The study's enrolment list (``study_pki enrol``), when the guide makes one."""
ROSTER = "roster.toml"
"""The study's roster of node keys (``study_pki roster``), which the sites pin."""


def write_site_files(
    site: Machine, name: str, frame: pd.DataFrame, superlink: str, *, enrolled: bool
) -> None:
    """site.toml as step 4 describes it (fedstats/examples/flower/site.toml), and its frame."""
    frame.to_parquet(site.root / "frame.parquet")
    config = {
        "site": {"name": name, "workdir": str(site.root / "work")},
        "data": {"frame": str(site.root / "frame.parquet")},
        "privacy": {"ledger": str(site.root / "site.ledger")},
        "disclosure": {"min_count": 10},
        "coordinator": {
            "superlink": superlink,
            "root_certificates": str(site.root / "study-ca.crt"),
            "auth_private_key": str(site.root / "node" / "node.key"),
        },
    }
    if enrolled:
        config["coordinator"]["enrolment"] = str(site.root / ENROLMENT)
    config["secure_aggregation"] = {  # verified paths, on by default, sign with the node key
        "roster": str(site.root / ROSTER),
        "signing_key": str(site.root / "node" / "node.key"),
    }
    (site.root / "site.toml").write_text(tomli_w.dumps(config), encoding="utf-8")


def write_study_file(coordinator: Machine, superlink: str, *, enrolled: bool) -> Path:
    """study.toml as step 5 describes it (fedstats/examples/flower/study.toml), one logistic fit."""
    out = coordinator.root / "out"
    config = {
        "study": {"name": "heart", "sites": SITES, "out": str(out)},
        "coordinator": {
            "superlink": superlink,
            "root_certificates": str(coordinator.root / "pki" / "study-ca.crt"),
            "run_timeout": 240,
        },
        "policy": {"round_timeout": 60, "discovery_timeout": 90},
        "fits": [{"kind": "logistic", "name": "y_logistic", "formula": FORMULA}],
    }
    if enrolled:
        config["identity"] = {
            "enrolment": str(coordinator.root / "pki" / ENROLMENT),
            "study_ca": str(coordinator.root / "pki" / "study-ca.crt"),
        }
    (coordinator.root / "study.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
    return out


def test_the_readme_deployment_guide_runs_as_written(tmp_path: Path) -> None:
    blocks = guide_blocks()
    roles = [role for _language, role, _text in blocks]
    assert {"coordinator", "site", "flwr-config"} <= set(roles), roles
    guide = "".join(text for _language, _role, text in blocks)
    assert "--host 0.0.0.0" in guide and "study-ca.crt" in guide and "superlink.crt" in guide

    port = processes.free_port()
    superlink = f"127.0.0.1:{port}"
    common = {
        "coordinator.example.org:8000": superlink,
        "--port 8000": f"--port {port}",
        "coordinator.example.org": "127.0.0.1",
    }
    coordinator = Machine(
        tmp_path / "coordinator", {"/etc/fedstats/": f"{tmp_path / 'coordinator'}/", **common}
    )
    sites = {
        name: Machine(
            tmp_path / name,
            {
                "/etc/fedstats/": f"{tmp_path / name}/",
                "region_0": name,
                "9094": str(processes.free_port()),
                **common,
            },
        )
        for name in SITES
    }
    for machine in (coordinator, *sites.values()):
        machine.root.mkdir()
    frames = site_frames()
    enrolled = "study_pki enrol" in guide
    out = write_study_file(coordinator, superlink, enrolled=enrolled)
    for name, site in sites.items():
        write_site_files(site, name, frames[name], superlink, enrolled=enrolled)

    everyone = [coordinator, *sites.values()]
    try:
        for language, role, text in blocks:
            if role == "flwr-config":
                assert language == "toml"
                home = coordinator.root / "flwr-home"
                home.mkdir(exist_ok=True)
                (home / "config.toml").write_text(coordinator.text(text), encoding="utf-8")
                continue
            if role == "coordinator":
                if "flwr supernode register" in text:  # each site's node.pub has arrived
                    for name, site in sites.items():
                        shutil.copy(
                            site.root / "node" / "node.pub",
                            coordinator.root / "pki" / f"{name}.pub",
                        )
                for command in commands(text):
                    if "flwr supernode register" in command:
                        for name in SITES:
                            coordinator.run(command.replace("region_0", name))
                    else:
                        coordinator.run(command)
                    if command.startswith("flower-superlink"):
                        processes.wait_for_port(port, 60, coordinator.background[-1])
                continue
            assert role == "site", role
            for site in sites.values():
                ca = coordinator.root / "pki" / "study-ca.crt"
                if ca.exists():  # the coordinator sent the study CA
                    shutil.copy(ca, site.root / "study-ca.crt")
                if (ca.parent / ENROLMENT).exists():  # and the enrolment list
                    shutil.copy(ca.parent / ENROLMENT, site.root / ENROLMENT)
                if (ca.parent / ROSTER).exists():  # and the roster
                    shutil.copy(ca.parent / ROSTER, site.root / ROSTER)
                for command in commands(text):
                    site.run(command)

        status = json.loads((out / "status.json").read_text(encoding="utf-8"))
        assert status["status"] == "completed", status
        assert (out / "compliance-report.html").stat().st_size > 0
        assert (out / "study").is_dir()
        over_flower = json.loads((out / "results" / "y_logistic.json").read_text())
        reference = LogisticRegression(FORMULA).fit(Federation.in_process(frames))
        for name, value in reference.params.items():
            assert abs(over_flower["params"][name] - value) <= 1e-8, name
        for site in sites.values():
            assert (site.root / "work" / "journal.jsonl").stat().st_size > 0
        # every exact round lay on a verified path the sites can re-derive on their own
        assert list((sites[SITES[0]].root / "work" / "paths").glob("*.request"))
        if enrolled:
            admitted = status["site_identity"]["sites"]
            assert sorted(admitted) == SITES and all(s["enrolled"] for s in admitted.values())
    except AssertionError as error:
        logs = "\n".join(m.logs() for m in everyone)
        raise AssertionError(f"{error}\n{logs}") from error
    finally:
        for machine in everyone:
            processes.stop(machine.background)
    for machine in everyone:
        for process in machine.background:
            assert process.poll() is not None, f"process {process.args} still runs"
