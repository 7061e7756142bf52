"""The README's deployment guide, run as written: every ``deploy`` block, on loopback.

README.md's "Deploying a study step by step" marks its commands with fenced
blocks whose info string is ``bash deploy coordinator``, ``bash deploy site``
or ``toml deploy flwr-config``. This test runs them in document order — the
coordinator's as they are, the sites' once per site — changing only what a
real deployment changes: ``/etc/fedstats/``, ``/var/lib/fedstats/`` and the
export folder ``/srv/ehr-export/`` become each machine's temporary folders,
``coordinator.example.org`` becomes 127.0.0.1, the ports become free ones and
``region_0`` each site's name. Commands ending in ``&`` are started in the
background (and all stopped at the end); the others must succeed. ``cp`` of a
relative path copies from the fedstats checkout (the guide's commands run in
it), and the copied file gets the same changes: so the sites serve the example
``site.toml`` and the coordinator runs the example ``study.toml`` that the
guide copies (``fedstats/examples/flower/``), and each site serves the frame
its guide commands harmonised from its (synthetic) export. The test writes no
configuration of its own. Files that travel between the machines in the guide
(``node.pub`` to the coordinator; ``study-ca.crt``, ``enrolment.toml``,
``roster.toml`` and ``study-spec.toml`` to the sites) are copied. The last
command, ``fedstats study run``, must finish the study: every fit recorded,
the compliance report written, and each fit equal to the embedded runtime's on
the sites' frames.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedstats import Federation, LogisticRegression
from fedstats.flower import processes
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.study_config import load_study_config
from tests.reports.release_checks import assert_every_release_named

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLES = ROOT / "fedstats" / "examples" / "flower"
BLOCK = re.compile(r"^```(bash|toml) deploy ([\w-]+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
GUIDE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
SENT_TO_SITES = ["study-ca.crt", "enrolment.toml", "roster.toml", "study-spec.toml"]
"""What the coordinator keeps in ``/etc/fedstats/pki/`` and sends every site, which keeps it in
``/etc/fedstats/`` (the guide, steps 1 and 3)."""


def guide_blocks() -> list[tuple[str, str, str]]:
    """(language, role, text) of every deploy block of the README, in order."""
    return [match.groups() for match in BLOCK.finditer(README.read_text(encoding="utf-8"))]


def commands(text: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


@dataclass
class Machine:
    """One machine of the guide: its folders (under ``root``) and substitutions."""

    root: Path
    replacements: dict[str, str]
    homes: int = 0
    background: list[subprocess.Popen] = field(default_factory=list)

    @property
    def etc(self) -> Path:
        """This machine's ``/etc/fedstats/``."""
        return Path(self.text("/etc/fedstats/"))

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
        """Run one of the guide's commands here (a ``&`` command in the background).

        ``cp`` copies a relative path from the checkout (ROOT), and the copy gets this
        machine's substitutions, as the commands do.
        """
        command = self.text(command)
        background = command.endswith("&")
        argv = shlex.split(command.rstrip("&").strip())
        copied = None
        if argv[0] == "cp":
            assert len(argv) == 3, command
            source, target = ROOT / argv[1], Path(argv[2])
            assert source.is_file() and target.is_absolute(), command
            argv = ["cp", str(source), str(target)]
            copied = target / source.name if target.is_dir() else target
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
        if copied is not None:
            copied.write_text(self.text(copied.read_text(encoding="utf-8")), encoding="utf-8")
        return done

    def run_all(self, block: list[str]) -> None:
        """Run a block's commands here, in order."""
        for command in block:
            self.run(command)

    def logs(self) -> str:
        return "\n".join(
            f"--- {log}\n{log.read_text(errors='replace')[-2000:]}"
            for log in sorted(self.root.glob("flwr-homes/*/output.log"))
        )


def test_the_readme_deployment_guide_runs_as_written(tmp_path: Path) -> None:
    blocks = guide_blocks()
    roles = [role for _language, role, _text in blocks]
    assert {"coordinator", "site", "flwr-config"} <= set(roles), roles
    guide = "".join(text for _language, role, text in blocks)
    assert "--host 0.0.0.0" in guide and "study-ca.crt" in guide and "superlink.crt" in guide
    site_commands = [c for _l, role, text in blocks if role == "site" for c in commands(text)]
    assert any(c.startswith("fedstats harmonize ") for c in site_commands), site_commands
    assert "cp fedstats/examples/flower/site.toml /etc/fedstats/site.toml" in site_commands
    assert "cp fedstats/examples/flower/study.toml /etc/fedstats/study.toml" in guide
    study_example = load_study_config(EXAMPLES / "study.toml")
    sites = study_example.study.sites  # the example study's sites are the guide's

    port = processes.free_port()
    superlink = f"127.0.0.1:{port}"
    common = {
        "coordinator.example.org:8000": superlink,
        "--port 8000": f"--port {port}",
        "coordinator.example.org": "127.0.0.1",
    }

    def folders(root: Path) -> dict[str, str]:
        return {
            "/etc/fedstats/": f"{root / 'etc'}/",
            "/var/lib/fedstats/": f"{root / 'var'}/",
            "/srv/ehr-export/": f"{root / 'export'}/",
        }

    coordinator = Machine(tmp_path / "coordinator", {**folders(tmp_path / "coordinator"), **common})
    machines = {
        name: Machine(
            tmp_path / name,
            {
                **folders(tmp_path / name),
                "region_0": name,
                "9094": str(processes.free_port()),
                **common,
            },
        )
        for name in sites
    }
    for machine in (coordinator, *machines.values()):
        machine.root.mkdir()
        machine.etc.mkdir(parents=True)

    everyone = [coordinator, *machines.values()]
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
                    for name, site in machines.items():
                        shutil.copy(
                            site.etc / "node" / "node.pub", coordinator.etc / "pki" / f"{name}.pub"
                        )
                for command in commands(text):
                    if "flwr supernode register" in command:
                        for name in sites:
                            coordinator.run(command.replace("region_0", name))
                    else:
                        coordinator.run(command)
                    if command.startswith("flower-superlink"):
                        processes.wait_for_port(port, 60, coordinator.background[-1])
                continue
            assert role == "site", role
            for site in machines.values():
                for sent in SENT_TO_SITES:  # what the coordinator has sent so far
                    if (coordinator.etc / "pki" / sent).exists():
                        shutil.copy(coordinator.etc / "pki" / sent, site.etc / sent)
            with ThreadPoolExecutor(len(machines)) as pool:  # the sites are separate machines
                block = commands(text)
                for done in [pool.submit(site.run_all, block) for site in machines.values()]:
                    done.result()

        study = load_study_config(coordinator.etc / "study.toml")
        out = study.study.out
        assert study.study.sites == sites and str(out).startswith(str(coordinator.root))
        status = json.loads((out / "status.json").read_text(encoding="utf-8"))
        assert status["status"] == "completed", status
        assert (out / "compliance-report.html").stat().st_size > 0
        assert (out / "study").is_dir()
        frames = {}
        for name, site in machines.items():
            config = load_site_config(site.etc / "site.toml")
            assert config.name == name
            # the frame the site served is the one its guide commands harmonised from its export
            assert config.data.frame is not None and config.data.frame.is_relative_to(site.root)
            assert (
                json.loads((config.data.frame.parent / "report.json").read_text())["site"] == name
            )
            frames[name] = pd.read_parquet(config.data.frame)
            assert (site.root / "var" / "site" / "journal.jsonl").stat().st_size > 0
            assert (config.workdir / "journal.jsonl").stat().st_size > 0
        assert not frames[sites[0]].equals(frames[sites[1]])  # each site its own patients
        assert sorted(fit.kind for fit in study.fits) == ["deep", "logistic"]
        # the report names every analysis that left a site, the network's training included
        report, tasks = assert_every_release_named(out / "study")
        assert {"deep.train", "deep.evaluate", "logistic.summaries"} <= tasks
        assert "1 exact trained network (died_mlp)" in report.verdict.text
        for fit in (fit for fit in study.fits if fit.kind == "logistic"):
            over_flower = json.loads((out / "results" / f"{fit.name}.json").read_text())
            reference = LogisticRegression(fit.formula).fit(Federation.in_process(frames))
            for term, value in reference.params.items():
                assert abs(over_flower["params"][term] - value) <= 1e-8, (fit.name, term)
        # every exact round lay on a verified path the sites can re-derive on their own
        first = load_site_config(machines[sites[0]].etc / "site.toml")
        assert list((first.workdir / "paths").glob("*.request"))
        if "study_pki enrol" in guide:
            admitted = status["site_identity"]["sites"]
            assert sorted(admitted) == sorted(sites) and all(
                s["enrolled"] for s in admitted.values()
            )
    except AssertionError as error:
        logs = "\n".join(m.logs() for m in everyone)
        raise AssertionError(f"{error}\n{logs}") from error
    finally:
        for machine in everyone:
            processes.stop(machine.background)
    for machine in everyone:
        for process in machine.background:
            assert process.poll() is not None, f"process {process.args} still runs"
