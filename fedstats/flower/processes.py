"""Starting, submitting to and stopping Flower's processes (SuperLink, SuperNodes, ``flwr run``).

Used by ``fedstats site run``, ``fedstats study run``, the tests and the
benchmark. Every process gets its own ``FLWR_HOME``, the environment turns
off telemetry, update checks and runtime dependency installation (a hospital
deployment makes no outbound call beyond its study), and the Python
environment's ``bin/`` comes first on ``PATH`` because the SuperLink and the
SuperNodes start ``flower-superexec``, ``flwr-serverapp`` and
``flwr-clientapp`` by name. Each process runs in its own process group so
that :func:`stop` ends it with every child it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedstats.errors import FlowerProcessError
from fedstats.flower.task_wakeup import WAKE_ENV, WAKE_FILE, make_wake_pipe

BIN = Path(sys.executable).parent
APP_DIR = Path(__file__).resolve().parents[1] / "examples" / "flower" / "app"
CONNECTION = "study"

QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
SERVERAPP_POLL_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25"}
"""How often the SuperLink's SuperExec asks for a run's ServerApp task (Flower's default 1 s).

Every ask is an HTTP call the SuperLink serves through its whole middleware stack, for the
SuperLink's life, not only while a run starts: at 0.02 s the SuperLink of an idle local study
used 18 % of a core (psutil, over 10 s), and as much while a study's rounds ran on the same
cores; at 0.25 s it uses about 4 %, and a run's ServerApp starts at most a quarter of a
second after ``flwr run``."""


@dataclass(frozen=True)
class Tls:
    """TLS files: the study CA, and for the SuperLink its certificate and key.

    :mod:`fedstats.flower.study_pki` makes all three.
    """

    ca: Path
    certificate: Path | None = None
    key: Path | None = None


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def flower_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one Flower process, with its own ``FLWR_HOME``."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(QUIET_ENV)
    env.update(SERVERAPP_POLL_ENV)
    env["FLWR_HOME"] = str(home)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _spawn(
    command: list[str], home: Path, log_name: str, extra: Mapping[str, str] | None = None
) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    log = (home / log_name).open("ab")
    return subprocess.Popen(
        command,
        env=flower_env(home, extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=home,
    )


def start_superlink(
    home: Path,
    port: int,
    *,
    tls: Tls | None = None,
    node_auth: bool = False,
    database: Path | None = None,
    simulation: bool = False,
) -> subprocess.Popen:
    """Start a SuperLink serving every API on ``127.0.0.1:port``.

    With ``simulation`` it runs Flower's simulation engine: a run's ClientApps
    are executed by ``flwr-simulation`` on virtual SuperNodes (Ray actors), their
    number and resources given with the run (:func:`submit_run`'s ``federation``).

    With ``tls`` every API (Fleet, Control, Runtime) speaks HTTPS with the
    SuperLink's certificate; the CA is what its own ServerApp runner trusts.
    With ``node_auth`` (which needs ``tls``) only SuperNodes whose public key
    was registered (:func:`register_node`) are served.
    """
    command = [str(BIN / "flower-superlink"), "--port", str(port)]
    command += ["--disable-runtime-dependency-installation"]
    if tls is None:
        if node_auth:
            raise FlowerProcessError("SuperNode authentication needs TLS: pass tls=Tls(...)")
        command.append("--insecure")
    else:
        if tls.certificate is None or tls.key is None:
            raise FlowerProcessError(
                "a SuperLink with TLS needs its certificate and key: "
                "Tls(ca, certificate, key), e.g. from fedstats.flower.study_pki"
            )
        command += ["--ssl-ca-certfile", _absolute(tls.ca)]
        command += ["--ssl-certfile", _absolute(tls.certificate)]
        command += ["--ssl-keyfile", _absolute(tls.key)]
    if node_auth:
        command.append("--enable-supernode-auth")
    if database is not None:
        command += ["--database", str(database)]
    if simulation:
        command.append("--simulation")
    return _spawn(command, home, "superlink.log")


def start_supernode(
    home: Path,
    superlink: str,
    port: int,
    site_config: Path,
    *,
    long_lived: bool = True,
    ca: Path | None = None,
    auth_private_key: Path | None = None,
    insecure: bool | None = None,
) -> list[subprocess.Popen]:
    """Start a site's SuperNode; its ClientApp reads ``site_config`` (the site's site.toml).

    ``long_lived`` (default): the SuperNode with its idle poll capped
    (:mod:`fedstats.flower.supernode`) in ``--isolation process`` mode, beside
    a long-lived fedstats ClientApp runner (:mod:`fedstats.flower_apps.site_worker`)
    — two processes, the node waking the runner for each task through a named pipe in
    ``home`` (:mod:`fedstats.flower.task_wakeup`). Otherwise Flower's stock SuperNode,
    which starts one ``flwr-clientapp`` process per message — one process (and its
    children).

    ``ca``: the study CA the SuperLink's certificate must chain to (TLS);
    without it the connection is plain HTTP unless ``insecure=False``, which
    makes the node trust the system's certificates instead.
    ``auth_private_key``: the site's node key (OpenSSH, ECDSA), whose public
    half the coordinator registered; the node signs its requests with it.
    """
    if insecure is None:
        insecure = ca is None
    if insecure and ca is not None:
        raise FlowerProcessError("a SuperNode given the study CA connects with TLS: drop insecure")
    if long_lived:
        # Run by path: the launcher imports flwr and only fedstats.flower.task_wakeup.
        command = [sys.executable, str(Path(__file__).with_name("supernode.py"))]
        command += ["--isolation", "process"]
    else:
        command = [str(BIN / "flower-supernode")]
    command += ["--superlink", superlink, "--port", str(port)]
    command += ["--node-config", f'site-config="{site_config}"']
    if insecure:
        command.append("--insecure")
    elif ca is not None:
        command += ["--root-certificates", _absolute(ca)]
    if auth_private_key is not None:
        command += ["--auth-supernode-private-key", _absolute(auth_private_key)]
    if not long_lived:
        return [_spawn(command, home, "supernode.log")]
    pipe = make_wake_pipe(home / WAKE_FILE)
    started = [_spawn(command, home, "supernode.log", {WAKE_ENV: str(pipe)})]
    worker = [sys.executable, "-m", "fedstats.flower_apps.site_worker"]
    worker += ["--runtime-api-address", f"127.0.0.1:{port}", "--wake-pipe", str(pipe)]
    started.append(_spawn(worker, home, "site-worker.log"))
    return started


def write_connection(home: Path, address: str, *, ca: Path | None = None) -> None:
    """Write ``$FLWR_HOME/config.toml`` with one SuperLink connection, the default."""
    home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]"]
    lines.append(f'address = "{address}"')
    lines.append("insecure = true" if ca is None else f'root-certificates = "{_absolute(ca)}"')
    (home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def register_node(home: Path, public_key: Path, *, name: str | None = None) -> int:
    """Register a site's node public key with the SuperLink of ``home``'s connection.

    ``flwr supernode register``, for a SuperLink started with
    ``--enable-supernode-auth``: only SuperNodes signing with the matching
    private key are then served. Returns the node id the SuperLink gave it.
    """
    command = [str(BIN / "flwr"), "supernode", "register", _absolute(public_key), CONNECTION]
    command += ["--format", "json"]
    if name is not None:
        command += ["--name", name]
    return int(_flwr_json(command, home, f"flwr supernode register {public_key}")["node-id"])


def online_nodes(home: Path) -> set[int]:
    """Ids of the nodes the SuperLink of ``home``'s connection lists as online."""
    command = [str(BIN / "flwr"), "supernode", "list", CONNECTION, "--format", "json"]
    reply = _flwr_json(command, home, "flwr supernode list")
    return {int(n["node-id"]) for n in reply.get("nodes", []) if n.get("status") == "online"}


def submit_run(
    home: Path,
    study_config: Path,
    *,
    app_dir: Path = APP_DIR,
    run_config: Mapping[str, str] | None = None,
    federation: Mapping[str, int | str | bool] | None = None,
) -> int:
    """Submit the fedstats app with ``study-config`` through ``flwr run``; returns the run id.

    ``run_config``: further run-config values (strings, e.g. ``simulated-sites``);
    ``federation``: Flower's federation config of a simulation run
    (``num-supernodes``, ``client-resources-num-cpus``, ``init-args-num-cpus``, ...).
    """
    command = [str(BIN / "flwr"), "run", str(app_dir), CONNECTION, "--format", "json"]
    command += ["--run-config", f'study-config="{study_config}"']
    for key, value in (run_config or {}).items():
        command += ["--run-config", f"{key}={json.dumps(str(value))}"]
    for key, value in (federation or {}).items():
        command += ["--federation-config", f"{key}={json.dumps(value)}"]
    return int(_flwr_json(command, home, "flwr run")["run-id"])


def _flwr_json(command: list[str], home: Path, what: str) -> dict:
    """Run a ``flwr ... --format json`` command; its JSON reply, or FlowerProcessError.

    ``flwr`` may exit with 0 when the operation failed (e.g. a refused
    registration): its JSON ``success`` field decides.
    """
    done = subprocess.run(
        command, env=flower_env(home), capture_output=True, text=True, timeout=120, check=False
    )
    reply = _json_reply(done.stdout)
    if done.returncode != 0 or not reply.get("success", False):
        raise FlowerProcessError(
            f"{what} failed (exit {done.returncode}): "
            f"{reply.get('error-message', done.stdout.strip()[-800:])} {done.stderr.strip()[-800:]}"
        )
    return reply


@contextlib.contextmanager
def running_superlink(home: Path, timeout: float = 60) -> Iterator[str]:
    """A plain SuperLink (:func:`start_superlink`) on a free port while the block runs, its
    address (``127.0.0.1:port``) given once it listens; stopped afterwards, and
    :class:`~fedstats.errors.FlowerProcessError` if it still runs then."""
    port = free_port()
    link = start_superlink(home, port)
    try:
        wait_for_port(port, timeout, link)
        yield f"127.0.0.1:{port}"
    finally:
        stop([link])
        if link.poll() is None:
            raise FlowerProcessError(f"the SuperLink on port {port} still runs after its stop")


def wait_for_port(port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Wait until something listens on ``127.0.0.1:port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise FlowerProcessError(f"process {process.args[0]} exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise FlowerProcessError(f"nothing listens on port {port} after {timeout:g} s")


STOP_GRACE = 1.5
"""Seconds a Flower process has after SIGTERM before SIGKILL: a SuperNode waits for its
servers and threads on a graceful exit (seconds, sometimes), and keeps nothing a site
needs (the site's ledger, journal and guard belong to its worker, which exits at once)."""


def stop(processes: Iterable[subprocess.Popen], grace: float = STOP_GRACE) -> None:
    """End each process and its process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
    processes = list(processes)
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        _signal_group(process, signal.SIGKILL)
        process.wait()


def kill(process: subprocess.Popen) -> None:
    """Kill a process and its group at once (SIGKILL), as a crash would."""
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _json_reply(stdout: str) -> dict:
    try:
        reply = json.loads(stdout)
    except json.JSONDecodeError:
        return {}
    return reply if isinstance(reply, dict) else {}


def _absolute(path: Path) -> str:
    """``path`` made absolute: every Flower process runs in its own ``FLWR_HOME`` folder."""
    return str(Path(path).resolve())


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
