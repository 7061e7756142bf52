"""Harmonisation at scale: 100,000 patients with 5,000,000 observations, FHIR and OMOP.

The same synthetic patients (:mod:`fedstats.synthetic_ehr`, 50 measurements
each, plus visits, diagnoses, prescriptions and deaths) are written once as
FHIR Bulk Data NDJSON and once as OMOP CDM 5.4 in a DuckDB file, then each
is harmonised under the demo study (``examples/demo/study.toml``) by
``fedstats harmonize`` in a fresh process, as a site's batch job would run
it. For each: wall time, and peak memory of the whole process tree (the run
and its validating workers; sampled every 50 ms with psutil, and the kernel's
``ru_maxrss`` of the largest single process as a cross-check). Measured side
by side in the same run: the time to merely parse every NDJSON line with
``json.loads`` (what any reader pays) and to scan the OMOP tables with DuckDB.
The two frames are compared (they must be identical) and both reports must
balance (read = included + excluded + rejected). Prints one JSON line.

    .venv/bin/python benchmarks/harmonize.py [--patients 100000] [--observations 5000000]
        [--workers N] [--memory-limit 1GB]

Targets: OMOP/DuckDB wall time under 60 s; NDJSON peak memory under 2 GB.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This script shares its name with the ``harmonize`` package: keep its folder off the path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import duckdb  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402

from fedstats.synthetic_ehr import (  # noqa: E402
    person_keys,
    synthetic_ehr,
    write_fhir_ndjson,
    write_omop_duckdb,
)

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "demo" / "study.toml"
OMOP_SECONDS_TARGET = 60.0
NDJSON_PEAK_GB_TARGET = 2.0
GB = 1e9


def harmonize_in_child(source: str, path: Path, out: Path, options: list[str]) -> dict:
    """Run ``fedstats harmonize`` in a new process; wall time and peak memory of its tree."""
    command = [
        sys.executable,
        "-m",
        "fedstats.cli",
        "harmonize",
        "--spec",
        str(SPEC),
        "--site",
        f"bench_{source}",
        f"--{source}",
        str(path),
        "--out",
        str(out),
        *options,
    ]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    tree = psutil.Process(child.pid)
    while child.poll() is None:
        try:
            processes = [tree, *tree.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in processes))
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - start
    errors = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"harmonize --{source} failed ({child.returncode}): {errors}")
    report = json.loads((out / "report.json").read_text())
    return {
        "seconds": round(wall, 2),
        "peak_gb": round(peak / GB, 3),
        "report": report,
    }


def parse_seconds(folder: Path) -> float:
    """Time to ``json.loads`` every line of every NDJSON file (no validation, no store)."""
    start = time.perf_counter()
    for path in sorted(folder.glob("*.ndjson")):
        with path.open("rb") as handle:
            for line in handle:
                json.loads(line)
    return time.perf_counter() - start


def scan_seconds(path: Path) -> float:
    """Time for DuckDB to read every column of every OMOP table once (counting values)."""
    start = time.perf_counter()
    with duckdb.connect(str(path), read_only=True) as connection:
        tables = [t for (t,) in connection.execute("SHOW TABLES").fetchall()]
        for table in tables:
            columns = [c for (c, *_) in connection.execute(f"DESCRIBE {table}").fetchall()]
            counts = ", ".join(f"count({c})" for c in columns)
            connection.execute(f"SELECT {counts} FROM {table}").fetchall()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=100_000)
    parser.add_argument("--observations", type=int, default=5_000_000)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--memory-limit", default="1GB")
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args()
    per_patient = max(1, args.observations // args.patients)

    with tempfile.TemporaryDirectory(prefix="fedstats-bench-") as folder:
        work = Path(folder)
        start = time.perf_counter()
        ehr = synthetic_ehr(args.patients, seed=args.seed, measurements_per_patient=per_patient)
        write_omop_duckdb(ehr, work / "omop.duckdb")
        write_fhir_ndjson(ehr, work / "fhir")
        setup = time.perf_counter() - start
        keys = person_keys(ehr)
        observations = len(ehr.measurements)
        del ehr

        options = ["--memory-limit", args.memory_limit]
        if args.workers is not None:
            options += ["--workers", str(args.workers)]
        omop = harmonize_in_child("omop", work / "omop.duckdb", work / "out_omop", options)
        ndjson = harmonize_in_child("fhir", work / "fhir", work / "out_fhir", options)
        parse = parse_seconds(work / "fhir")
        scan = scan_seconds(work / "omop.duckdb")

        from_omop = pd.read_parquet(work / "out_omop" / "frame.parquet").sort_index()
        from_fhir = pd.read_parquet(work / "out_fhir" / "frame.parquet")
        from_fhir = from_fhir.rename(index=keys).sort_index()
        identical = from_fhir.equals(from_omop) and len(from_omop) > 0
        ndjson_bytes = sum(p.stat().st_size for p in (work / "fhir").glob("*.ndjson"))

    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / GB
    result = {
        "benchmark": "harmonize",
        "patients": args.patients,
        "observations": observations,
        "ndjson_gb": round(ndjson_bytes / GB, 2),
        "setup_seconds": round(setup, 1),
        "omop_seconds": omop["seconds"],
        "omop_peak_gb": omop["peak_gb"],
        "ndjson_seconds": ndjson["seconds"],
        "ndjson_peak_gb": ndjson["peak_gb"],
        "largest_single_process_gb": round(children, 3),
        "ndjson_parse_only_seconds": round(parse, 1),
        "ndjson_time_ratio_vs_parse_only": round(ndjson["seconds"] / parse, 2),
        "omop_scan_only_seconds": round(scan, 2),
        "omop_time_ratio_vs_scan_only": round(omop["seconds"] / scan, 2),
        "records_read": {"omop": omop["report"]["read"], "fhir": ndjson["report"]["read"]},
        "balanced": omop["report"]["balanced"] and ndjson["report"]["balanced"],
        "frame_patients": len(from_omop),
        "frames_identical": bool(identical),
        "workers": args.workers if args.workers is not None else "auto",
        "cpus": os.cpu_count(),
        "memory_limit": args.memory_limit,
        "omop_target_met": omop["seconds"] < OMOP_SECONDS_TARGET,
        "ndjson_memory_target_met": ndjson["peak_gb"] < NDJSON_PEAK_GB_TARGET,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
