"""Per-round latency and bytes of federated logistic regression over Flower vs the embedded runtime.

Starts a SuperLink and 3, then 10, SuperNodes as separate processes on
loopback (each site with a long-lived ClientApp runner and the capped idle
poll, see ``fedstats.flower``), fits the same logistic regression over Flower
and in-process on synthetic sites, and prints one JSON line. A round is one
request to every site and all their replies (rows of the message
inventory); its latency runs from the first request sent to the last reply
received. Run: ``.venv/bin/python benchmarks/flower.py``.
"""

from __future__ import annotations

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


def over_flower(frames: dict, root: Path) -> dict:
    study = LocalStudy(root)
    try:
        started = time.perf_counter()
        study.start(frames)
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
        }
    finally:
        study.close()


def main() -> None:
    result = {"benchmark": "flower_logistic_round", "python": platform.python_version()}
    for n_sites in (3, 10):
        frames = datasets.synthetic_logistic(
            n_sites=n_sites, n_per_site=200, n_covariates=4, seed=11
        )
        with tempfile.TemporaryDirectory(prefix=f"fedstats-flower-{n_sites}-") as folder:
            result[f"sites_{n_sites}"] = {
                "flower": over_flower(frames, Path(folder)),
                "embedded": embedded(frames),
            }
    print(json.dumps(result), file=sys.stdout)


if __name__ == "__main__":
    main()
