"""Without the ``linkage`` extra, fedstats still runs every horizontal analysis.

clkhash, anonlink, bitarray, phe and gmpy2 are the ``linkage`` extra (vertical studies);
a site or a coordinator that never links must not need them (clkhash in particular is
installed apart, without its declared dependencies). In a fresh interpreter on this
checkout where importing any of them fails, an in-process exact logistic regression on
the Cleveland data runs and equals the one fitted with the extra; the linkage schema
still parses (sites check it); and asking for an encoding names the missing package and
how to install it. The control case shows the blocker is effective: importing clkhash
itself fails there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fedstats
from fedstats import datasets

ROOT = Path(__file__).resolve().parents[2]
EXTRA = ("clkhash", "anonlink", "bitarray", "phe", "gmpy2")

WITHOUT_EXTRA = f"""
import importlib.abc, json, sys

class NoExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NoExtra())
out = {{}}
try:
    import clkhash  # noqa: F401
    out["control"] = "imported"
except ModuleNotFoundError:
    out["control"] = "blocked"

import fedstats
import linkage
from fedstats import datasets

data = datasets.heart_disease()
frames = {{site: data.frames[site] for site in ("cleveland", "hungary")}}
fed = fedstats.Federation.in_process(frames)
formula, levels = datasets.HEART_EXACT_FORMULA, datasets.HEART_LEVELS
res = fedstats.LogisticRegression(formula, levels=levels).fit(fed)
out["params"] = res.params.tolist()
schema = linkage.parse_linkage_table(
    {{"fields": [{{"name": "birth_date", "ngram": 1, "bits": 100}}], "length": 1024,
     "threshold": 0.8}}
)
out["fingerprint"] = schema.fingerprint()
try:
    linkage.encode
except ModuleNotFoundError as error:
    out["encode"] = str(error)
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in {EXTRA!r})
print(json.dumps(out))
"""


def test_horizontal_fits_run_without_the_linkage_extra():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA], cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["control"] == "blocked" and out["loaded"] == []
    data = datasets.heart_disease()
    fed = fedstats.Federation.in_process({s: data.frames[s] for s in ("cleveland", "hungary")})
    expected = fedstats.LogisticRegression(
        datasets.HEART_EXACT_FORMULA, levels=datasets.HEART_LEVELS
    ).fit(fed)
    assert out["params"] == expected.params.tolist()
    assert len(out["fingerprint"]) == 64
    assert "clkhash" in out["encode"] and "pip install --no-deps clkhash==0.18.3" in out["encode"]
