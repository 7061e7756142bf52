"""Secure aggregation's cost per round against a plain sum, for 5 and 20 sites.

Each site replies one update vector of ``--length`` float entries (default
52,000, the parameter count of a 3-layer MLP on 30 features with hidden
sizes 256 and 128: 30*256+256 + 256*128+128 + 128+1 = 41,345, rounded up).
One round is timed as the plain request with the coordinator's sum, and as a
whole secure-aggregation session (keys, sealed shares, masked replies,
unmasking); and with one site lost at the masked round (threshold n - 1),
for which the coordinator rebuilds that site's masking key and removes its
pairwise masks from the others' replies. All sites run in this process, so
the time is computation and encoding, not network. Prints one JSON line.

    .venv/bin/python benchmarks/secagg.py [--length 52000] [--repeats 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import fedstats  # noqa: E402
from fedstats.contract import codec  # noqa: E402
from fedstats.schema import Array  # noqa: E402
from fedstats.site.registry import REGISTRY  # noqa: E402
from fedstats.site.task import Task, TaskRegistry, TaskReply  # noqa: E402

UPDATE = "benchmark.update"


def registry(length: int) -> TaskRegistry:
    tasks = TaskRegistry(list(REGISTRY))

    def update(ctx, args):
        rng = np.random.default_rng(abs(hash(ctx.name)) % 2**32)
        return TaskReply({"update": rng.normal(0, 0.01, length)}, contributors=len(ctx.frame))

    tasks.add(Task(UPDATE, update, lambda args: {"update": Array((length,))}, "a model update"))
    return tasks


class LostAtMaskedRound:
    """A transport whose site goes away instead of sending its masked reply."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def __call__(self, request: bytes) -> bytes:
        if codec.decode(request)["task"] == UPDATE:
            raise ConnectionError("site went away")
        return self.handle(request)


def one_size(sites: int, length: int, repeats: int) -> dict:
    frames = {f"site{i}": pd.DataFrame({"x": np.zeros(50)}) for i in range(sites)}
    tasks = registry(length)
    fed = fedstats.Federation.in_process(frames, registry=tasks)
    plain_times, secure_times, dropout_times = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        replies = fed.request(UPDATE, {}, analysis="plain")
        plain = sum(r["update"] for r in replies.values())
        plain_times.append(time.perf_counter() - start)

        start = time.perf_counter()
        summed = fedstats.secure_sum(
            fed, UPDATE, {}, analysis="secure", options=fedstats.SecureAggregation()
        )
        secure_times.append(time.perf_counter() - start)
        error = float(np.max(np.abs(summed.total["update"] - plain)))

        transports = {s: silo.handle for s, silo in fed.silos.items()}
        transports["site0"] = LostAtMaskedRound(transports["site0"])
        lossy = fedstats.Federation(transports, registry=tasks)
        start = time.perf_counter()
        partial = fedstats.secure_sum(
            lossy,
            UPDATE,
            {},
            analysis="dropout",
            options=fedstats.SecureAggregation(threshold=sites - 1),
        )
        dropout_times.append(time.perf_counter() - start)
        expected = plain - replies["site0"]["update"]
        dropout_error = float(np.max(np.abs(partial.total["update"] - expected)))
    inventory = fed.inventory.to_frame()
    per_site_plain = inventory.query("analysis == 'plain'")
    per_site_secure = inventory.query("analysis == 'secure'")
    bytes_plain = (per_site_plain.request_bytes + per_site_plain.reply_bytes).sum() / (
        sites * repeats
    )
    bytes_secure = (per_site_secure.request_bytes + per_site_secure.reply_bytes).sum() / (
        sites * repeats
    )
    return {
        "sites": sites,
        "plain_seconds": round(statistics.median(plain_times), 4),
        "secure_seconds": round(statistics.median(secure_times), 4),
        "secure_with_one_dropout_seconds": round(statistics.median(dropout_times), 4),
        "time_ratio": round(statistics.median(secure_times) / statistics.median(plain_times), 2),
        "bytes_per_site_plain": int(bytes_plain),
        "bytes_per_site_secure": int(bytes_secure),
        "bytes_ratio": round(bytes_secure / bytes_plain, 3),
        "max_abs_error_vs_plain_sum": error,
        "max_abs_error_with_dropout": dropout_error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=52_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    out = {
        "benchmark": "secagg",
        "length": args.length,
        "by_sites": [one_size(n, args.length, args.repeats) for n in (5, 20)],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
