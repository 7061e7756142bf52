"""Per-round latency and bytes of federated logistic regression over Flower's deployment
engine vs the embedded runtime, and what an idle site costs.

Starts a SuperLink and 3, then 10, SuperNodes as separate processes on
loopback (each site a SuperNode and a long-lived ClientApp runner, paced by
:class:`fedstats.flower.study_pace.StudyPace`), fits the same logistic
regression over Flower and in-process on synthetic sites, and prints one
JSON line. A round is one request to every site and all their replies (rows
of the message inventory); its latency runs from the first request sent to
the last reply received.

Idle cost: before the study, once every process has started, the CPU time
of each site's two processes (SuperNode and worker, with their children) is
read with psutil over ``--idle-seconds``; ``idle_site_cpu_percent`` is the
largest site's share of one core.

Targets: median round at most 0.3 s with 3 sites and 1.0 s with 10; an idle
site at most 2 % of a core. Run: ``.venv/bin/python benchmarks/flower.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: drop this folder from the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import psutil  # noqa: E402

import fedstats  # noqa: E402
from fedstats import datasets  # noqa: E402
from fedstats.flower.local_study import LocalStudy, write_study  # noqa: E402
from studyfiles.inventory import MessageRecord  # noqa: E402

FIT = """
[[fits]]
kind = "logistic"
name = "bench"
formula = "y ~ x1 + x2 + x3 + x4"
"""
ROUND_TASK = "logistic.summaries"
ROUND_TARGETS = {3: 0.3, 10: 1.0}
IDLE_CPU_TARGET = 2.0
SETTLE_SECONDS = 5.0
"""Wait after every site worker asks its SuperNode for tasks before idle CPU is read."""


def rounds(rows: list[dict], n_sites: int) -> list[dict]:
    """Latency (s) and bytes of each Newton round: ``n_sites`` consecutive ``ROUND_TASK`` rows."""
    picked = [r for r in rows if r["task"] == ROUND_TASK]
    out = []
    for start in range(0, len(picked), n_sites):
        chunk = picked[start : start + n_sites]
        first = datetime.fromisoformat(chunk[0]["sent_at"]).timestamp()
        last = max(datetime.fromisoformat(r["sent_at"]).timestamp() + r["seconds"] for r in chunk)
        out.append(
            {
                "seconds": last - first,
                "bytes": sum(r["request_bytes"] + r["reply_bytes"] for r in chunk),
            }
        )
    return out


def summary(per_round: list[dict]) -> dict:
    seconds = [r["seconds"] for r in per_round]
    return {
        "rounds": len(per_round),
        "round_seconds_median": statistics.median(seconds),
        "round_seconds_mean": statistics.fmean(seconds),
        "round_seconds_max": max(seconds),
        "round_bytes": per_round[0]["bytes"],
    }


def embedded(frames: dict) -> dict:
    federation = fedstats.Federation.in_process(frames)
    fedstats.LogisticRegression("y ~ x1 + x2 + x3 + x4").fit(federation)
    rows = [_row(record) for record in federation.inventory]
    return summary(rounds(rows, len(frames)))


def _row(record: MessageRecord) -> dict:
    return {
        "task": record.task,
        "sent_at": record.sent_at.isoformat(),
        "seconds": record.seconds,
        "request_bytes": record.request_bytes,
        "reply_bytes": record.reply_bytes,
    }


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time (user + system) of ``process`` and its living children."""
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def idle_site_cpu(study: LocalStudy, seconds: float) -> dict:
    """Each site's share of one core (%) while no study runs, over ``seconds``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        logs = list((study.root / "nodes").glob("*/site-worker.log"))
        ready = [log for log in logs if "for tasks" in log.read_text(errors="replace")]
        if len(ready) == len(study.nodes):
            break
        time.sleep(0.2)
    time.sleep(SETTLE_SECONDS)
    sites = {name: [psutil.Process(p.pid) for p in group] for name, group in study.nodes.items()}
    before = {name: sum(cpu_seconds(p) for p in group) for name, group in sites.items()}
    started = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - started
    after = {name: sum(cpu_seconds(p) for p in group) for name, group in sites.items()}
    shares = {name: 100 * (after[name] - before[name]) / wall for name in sites}
    return {
        "idle_site_cpu_percent": round(max(shares.values()), 3),
        "idle_site_cpu_percent_mean": round(statistics.fmean(shares.values()), 3),
        "idle_seconds_measured": round(wall, 1),
    }


def over_flower(frames: dict, root: Path, idle_seconds: float) -> dict:
    study = LocalStudy(root)
    try:
        started = time.perf_counter()
        study.start(frames)
        idle = idle_site_cpu(study, idle_seconds) if idle_seconds > 0 else {}
        out = root / "out"
        config = write_study(root, list(frames), FIT, out=out, round_timeout=60)
        status = study.run(config, out, timeout=600)
        if status["status"] != "completed":
            raise RuntimeError(f"the study failed: {status}")
        inventory = out / f"inventory-{status['run_id']}.jsonl"
        rows = [json.loads(line) for line in inventory.read_text().splitlines()]
        return {
            **summary(rounds(rows, len(frames))),
            "fit_seconds_in_serverapp": status["seconds"],
            "wall_seconds_with_startup": time.perf_counter() - started,
            **idle,
        }
    finally:
        study.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    result: dict = {"benchmark": "flower_logistic_round", "python": platform.python_version()}
    meets = []
    for n_sites in args.sites:
        frames = datasets.synthetic_logistic(
            n_sites=n_sites, n_per_site=200, n_covariates=4, seed=11
        )
        with tempfile.TemporaryDirectory(prefix=f"fedstats-flower-{n_sites}-") as folder:
            flower = over_flower(frames, Path(folder), args.idle_seconds)
        entry = {"flower": flower, "embedded": embedded(frames)}
        if n_sites in ROUND_TARGETS:
            entry["round_target_s"] = ROUND_TARGETS[n_sites]
            entry["round_meets_target"] = flower["round_seconds_median"] <= ROUND_TARGETS[n_sites]
            meets.append(entry["round_meets_target"])
        if "idle_site_cpu_percent" in flower:
            entry["idle_cpu_target_percent"] = IDLE_CPU_TARGET
            entry["idle_cpu_meets_target"] = flower["idle_site_cpu_percent"] <= IDLE_CPU_TARGET
            meets.append(entry["idle_cpu_meets_target"])
        result[f"sites_{n_sites}"] = entry
    result["meets_targets"] = all(meets)
    print(json.dumps(result), file=sys.stdout)


if __name__ == "__main__":
    main()
