"""A study on one machine: a SuperLink and a SuperNode per site, separate processes on loopback.

For tests, benchmarks and trying a deployment out: every site gets a folder
with its frame and site.toml, the coordinator a study.toml, and every process
its own ``FLWR_HOME``. :meth:`LocalStudy.close` stops every process started.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedstats.flower import processes

STUDY_TEMPLATE = """
[study]
name = "{name}"
sites = {sites}
out = "{out}"

[policy]
round_timeout = {round_timeout}
on_site_lost = "{on_site_lost}"
retries = {retries}
discovery_timeout = 60
poll_interval = 0.005
{fits}
"""

SITE_TEMPLATE = """
[site]
name = "{name}"
workdir = "{workdir}"

[data]
frame = "{frame}"

[privacy]
ledger = "{ledger}"

[coordinator]
superlink = "{superlink}"
insecure = true
"""


def write_site(root: Path, name: str, frame: pd.DataFrame, superlink: str) -> Path:
    """A site folder with its frame and site.toml; returns the site.toml path."""
    folder = root / "sites" / name
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(folder / "frame.parquet")
    path = folder / "site.toml"
    path.write_text(
        SITE_TEMPLATE.format(
            name=name,
            workdir=folder / "work",
            frame=folder / "frame.parquet",
            ledger=folder / "site.ledger",
            superlink=superlink,
        ),
        encoding="utf-8",
    )
    return path


def write_study(
    root: Path,
    sites: list[str],
    fits: str,
    *,
    out: Path,
    round_timeout: float = 30,
    on_site_lost: str = "abort",
    retries: int = 0,
) -> Path:
    path = root / f"study-{out.name}.toml"
    path.write_text(
        STUDY_TEMPLATE.format(
            name="flower-bench",
            sites=json.dumps(sites),
            out=out,
            round_timeout=round_timeout,
            on_site_lost=on_site_lost,
            retries=retries,
            fits=fits,
        ),
        encoding="utf-8",
    )
    return path


@dataclass
class LocalStudy:
    """The processes of a local study; :meth:`close` stops every one of them."""

    root: Path
    port: int = 0
    superlink: subprocess.Popen | None = None
    nodes: dict[str, list[subprocess.Popen]] = field(default_factory=dict)
    site_configs: dict[str, Path] = field(default_factory=dict)
    stopped: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    long_lived: bool = True

    def start(self, frames: dict[str, pd.DataFrame]) -> LocalStudy:
        self.port = processes.free_port()
        self.superlink = processes.start_superlink(self.root / "link", self.port)
        processes.wait_for_port(self.port, 60, self.superlink)
        processes.write_connection(self.root / "user", self.address)
        for name, frame in frames.items():
            self.site_configs[name] = write_site(self.root, name, frame, self.address)
            self.start_node(name)
        return self

    def start_node(self, name: str) -> None:
        self.nodes[name] = processes.start_supernode(
            self.root / "nodes" / f"{name}-{time.monotonic_ns()}",
            self.address,
            processes.free_port(),
            self.site_configs[name],
            long_lived=self.long_lived,
        )

    def kill_node(self, name: str) -> None:
        for process in self.nodes.pop(name):
            processes.kill(process)
            self.stopped.append(process)

    def run(self, study: Path, out: Path, timeout: float = 150) -> dict:
        """Submit the study and wait for its status.json to say completed or failed."""
        status_path = out / "status.json"
        status_path.unlink(missing_ok=True)
        run_id = processes.submit_run(self.root / "user", study)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if status_path.is_file():
                status = json.loads(status_path.read_text())
                if status.get("run_id") == run_id and status["status"] != "running":
                    return status
            if self.superlink is not None and self.superlink.poll() is not None:
                raise processes.FlowerProcessError(f"the SuperLink exited: {self.logs()}")
            time.sleep(0.1)
        raise processes.FlowerProcessError(
            f"run {run_id} did not finish within {timeout} s: {self.logs()}"
        )

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
