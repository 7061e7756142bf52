"""Study data for demos, notebooks, tests and benchmarks.

* :func:`heart_disease`: the UCI Heart Disease data from four hospitals
  (Janosi, Steinbrunn, Pfisterer & Detrano, 1988; CC BY 4.0), prepared as in
  the FLamby Fed-Heart-Disease benchmark (du Terrail et al., NeurIPS 2022):
  drop ``slope``, ``ca`` and ``thal``, then rows with missing values; outcome
  ``disease = num > 0``. Every dropped row is counted per site.
* :func:`tcga_brca`: TCGA-BRCA survival data in six regions (FLamby
  Fed-TCGA-BRCA), with FLamby's train/test split.
* :func:`synthetic_logistic`: a reproducible multi-site logistic dataset with
  site-specific covariate shifts, for parity tests and benchmarks.

The heart-disease and TCGA-BRCA files ship with the package
(``fedstats/data/<dataset>/``, byte-identical to their sources, each folder
with its licence and citation in ``README.md``), so demos and notebooks need
nothing beside an installation. Where they are read from (:func:`dataset_dir`):

1. the ``data_dir`` argument, when given: ``data_dir/<dataset>/`` must hold the
   dataset's files (an explicit request is never replaced by another copy);
2. else ``$FEDSTATS_DATA/<dataset>/`` when that folder exists (an override,
   e.g. a site's own copy); its files must then all be there;
3. else the packaged copy.

Data that is not shipped (the FHIR and OMOP test extracts) stays in the
shared data folder, found by :func:`default_data_dir`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from fedstats.errors import DataFileError

HEART_COLUMNS = [
    "age",
    "sex",
    "cp",
    "trestbps",
    "chol",
    "fbs",
    "restecg",
    "thalach",
    "exang",
    "oldpeak",
    "slope",
    "ca",
    "thal",
    "num",
]
HEART_FILES = {
    "cleveland": "processed.cleveland.data",
    "hungary": "processed.hungarian.data",
    "switzerland": "processed.switzerland.data",
    "va": "processed.va.data",
}
HEART_CITATION = (
    "UCI Heart Disease (Janosi, Steinbrunn, Pfisterer & Detrano, 1988; CC BY 4.0), "
    "four hospitals as in FLamby Fed-Heart-Disease"
)
HEART_FORMULA = (
    "disease ~ age + sex + C(cp) + trestbps + chol + fbs + C(restecg) + thalach + exang + oldpeak"
)

HEART_EXACT_SITES = ("cleveland", "hungary", "va")
"""The hospitals whose columns pass the default small-cell rules one at a time. Switzerland's
46 complete cases hold one patient without disease (a cell of one) and two with atypical
angina, so it refuses exact heart-disease analyses (``DisclosureError``, rule ``cells``) and
takes part in private ones. Crossed with ``disease`` (rule ``cross-cells``), the reference
model :data:`HEART_FORMULA` still holds a cell of 1-2 patients at each of these: Cleveland's
four patients with an ST-T abnormality (``restecg = 1``) include one without disease,
Hungary's with LV hypertrophy (``restecg = 2``) one with it, and VA's women two without it.
So an exact fit of :data:`HEART_FORMULA` needs a study that allows small cells;
:data:`HEART_EXACT_FORMULA` is answered at Cleveland and Hungary under the default rules."""

HEART_EXACT_FORMULA = HEART_FORMULA.replace("C(restecg)", "I(restecg > 0)")
"""The reference model with the two abnormal resting ECGs as one level (``I(restecg > 0)``:
abnormal against normal), the global recoding that removes its one-patient cells of
``restecg`` and ``disease`` (Hundepool et al., *Statistical Disclosure Control*, 2012,
§3.4.2): the exact model the default rules answer at Cleveland and Hungary (VA's cross-cell
of sex and disease remains)."""

HEART_LEVELS = {"cp": [1, 2, 3, 4], "restecg": [0, 1, 2]}
"""The categorical codes of the UCI data dictionary (public; a private fit declares them)."""
HEART_BOUNDS = {
    "age": (20, 80),
    "trestbps": (80, 200),
    "chol": (0, 600),
    "thalach": (60, 210),
    "oldpeak": (-3, 7),
    "sex": (0, 1),
    "fbs": (0, 1),
    "exang": (0, 1),
}
"""Plausible clinical ranges of the numeric covariates (public bounds for a private fit)."""


@dataclass(frozen=True)
class SiteFrames:
    """Analysis frames by site, with the rows excluded at each site and why."""

    frames: dict[str, pd.DataFrame]
    read: dict[str, int]
    excluded: dict[str, int]
    exclusion_reason: str
    source: str
    folder: Path | None = None
    """The folder the files were read from (:func:`dataset_dir`)."""

    def only(self, sites: tuple[str, ...] | list[str]) -> SiteFrames:
        """The same data, for these sites only (e.g. :data:`HEART_EXACT_SITES`)."""
        unknown = sorted(set(sites) - set(self.frames))
        if unknown:
            raise DataFileError(f"no sites {unknown} here; the sites are {list(self.frames)}")
        return SiteFrames(
            {s: self.frames[s] for s in sites},
            {s: self.read[s] for s in sites},
            {s: self.excluded[s] for s in sites},
            self.exclusion_reason,
            self.source,
            self.folder,
        )

    def counts(self) -> pd.DataFrame:
        """Rows read, excluded and kept per site."""
        return pd.DataFrame(
            {
                "read": self.read,
                "excluded": self.excluded,
                "kept": {s: len(f) for s, f in self.frames.items()},
            }
        )


DATA_ENV = "FEDSTATS_DATA"
"""The environment variable naming the shared data folder (an override of the packaged data)."""

DATASET_FILES = {
    "heart_disease": tuple(HEART_FILES.values()),
    "tcga_brca": ("brca.csv", "train_test_split.csv"),
}
"""The files each packaged dataset's reader needs."""


def packaged_data_dir() -> Path:
    """The datasets shipped inside the package (``fedstats/data``)."""
    folder = resources.files("fedstats").joinpath("data")
    if not isinstance(folder, Path):  # a zipped installation has no folder to read from
        raise DataFileError(
            f"fedstats is installed as an archive ({folder}); install it as a folder "
            f"(pip install) or set {DATA_ENV} to a folder holding the datasets"
        )
    return folder


def dataset_dir(name: str, data_dir: str | Path | None = None) -> Path:
    """The folder a packaged dataset (``heart_disease`` or ``tcga_brca``) is read from.

    ``data_dir/name`` when ``data_dir`` is given; else ``$FEDSTATS_DATA/name``
    when that folder exists; else the packaged copy. The chosen folder must
    hold every file the reader needs: a :class:`DataFileError` names the folder
    and the missing files, and says how to fall back to the packaged copy.
    """
    if name not in DATASET_FILES:
        raise DataFileError(f"no packaged dataset {name!r}; the datasets are {list(DATASET_FILES)}")
    override = os.environ.get(DATA_ENV)
    if data_dir is not None:
        folder = Path(data_dir) / name
        remedy = f"pass a data folder whose {name}/ holds them, or none to use the packaged copy"
    elif override and (Path(override) / name).is_dir():
        folder = Path(override) / name
        remedy = (
            f"complete it, or remove it (or unset {DATA_ENV}) to use the copy shipped with fedstats"
        )
    else:
        folder = packaged_data_dir() / name
        remedy = "the installation is incomplete: reinstall fedstats"
    missing = [file for file in DATASET_FILES[name] if not (folder / file).is_file()]
    if missing:
        raise DataFileError(f"{folder}: file not found: {', '.join(missing)}; {remedy}")
    return folder


def default_data_dir() -> Path:
    """The shared data folder, for data the package does not ship (FHIR and OMOP extracts).

    ``$FEDSTATS_DATA`` when set (it must then be a folder), else ``shared/data``
    beside the project checkout or beside the working directory.
    """
    override = os.environ.get(DATA_ENV)
    if override:
        if not Path(override).is_dir():
            raise DataFileError(f"{DATA_ENV}={override} is not a folder; point it at one")
        return Path(override)
    here = Path(__file__).resolve()
    candidates: list[Path] = []
    for candidate in (here.parents[2] / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if candidate.resolve() not in candidates:
            candidates.append(candidate.resolve())
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise DataFileError(
        "no shared data folder (the FHIR and OMOP extracts, which fedstats does not ship): "
        f"looked in {', '.join(str(c) for c in candidates)}; set {DATA_ENV} to the folder "
        "holding fhir/ and omop/"
    )


def heart_disease(data_dir: str | Path | None = None) -> SiteFrames:
    """The four hospitals' heart-disease frames, one row per patient.

    Columns: ``age sex cp trestbps chol fbs restecg thalach exang oldpeak``
    and the outcome ``disease`` (1 when ``num > 0``). Rows with a missing
    value in a kept column are excluded and counted. The files are read from
    :func:`dataset_dir` (``data_dir/heart_disease``, ``$FEDSTATS_DATA/heart_disease``
    or the packaged copy).
    """
    folder = dataset_dir("heart_disease", data_dir)
    frames, read, excluded = {}, {}, {}
    for site, filename in HEART_FILES.items():
        raw = _read_uci(folder / filename)
        kept = raw.drop(columns=["slope", "ca", "thal"])
        complete = kept.dropna()
        read[site] = len(raw)
        excluded[site] = len(raw) - len(complete)
        frame = complete.drop(columns=["num"]).copy()
        for column in frame.columns:
            values = frame[column]
            if (values == values.round()).all():  # codes and whole numbers read as floats
                frame[column] = values.astype(np.int64)
        frame["disease"] = (complete["num"] > 0).astype(np.int64)
        frames[site] = frame.reset_index(drop=True)
    return SiteFrames(
        frames,
        read,
        excluded,
        "missing value in a kept column (slope, ca, thal dropped first)",
        HEART_CITATION,
        folder,
    )


def heart_disease_split(
    data_dir: str | Path | None = None,
) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """FLamby's Fed-Heart-Disease train/test split of :func:`heart_disease` (du Terrail et
    al., NeurIPS 2022): per site 66/34 with ``train_test_split(random_state=43)``, stratified
    by ``disease`` where the site has at least two patients of each outcome.

    Returns ``(train, test)``, each a frame per site with a fresh index.
    """
    from sklearn.model_selection import train_test_split

    train, test = {}, {}
    for site, frame in heart_disease(data_dir).frames.items():
        both = frame["disease"].value_counts().min() >= 2
        tr, te = train_test_split(
            frame, test_size=0.34, random_state=43, stratify=frame["disease"] if both else None
        )
        train[site], test[site] = tr.reset_index(drop=True), te.reset_index(drop=True)
    return train, test


TCGA_CITATION = (
    "TCGA-BRCA clinical data (GDC open access; Liu et al., Cell 2018), six regions of "
    "tissue-source sites as in FLamby Fed-TCGA-BRCA (du Terrail et al., NeurIPS 2022)"
)


def tcga_brca(data_dir: str | Path | None = None) -> SiteFrames:
    """TCGA-BRCA survival frames, one per region of tissue-source sites (``region_0`` ..).

    Columns: the 39 one-hot clinical features and ``age_at_index`` with names
    made formula-friendly (lower case, other characters as ``_``), ``time``
    (days, from ``T``), ``event`` (from ``E``), and ``split`` (``train`` or
    ``test``, FLamby's split). The region is the index in the split file's
    ``fold2`` (``train_3`` is region 3); patients missing from the split file
    are excluded and counted. The files are read from :func:`dataset_dir`
    (``data_dir/tcga_brca``, ``$FEDSTATS_DATA/tcga_brca`` or the packaged copy).
    """
    folder = dataset_dir("tcga_brca", data_dir)
    data = pd.read_csv(folder / "brca.csv")
    split = pd.read_csv(folder / "train_test_split.csv")
    parts = split["fold2"].str.extract(r"^(train|test)_([0-5])$")
    if parts.isna().any().any():
        line = int(parts.isna().any(axis=1).to_numpy().argmax()) + 2
        raise DataFileError(f"{folder / 'train_test_split.csv'}, line {line}: fold2 not train_k")
    split = split.assign(split=parts[0], region=parts[1].astype(int))[["pid", "split", "region"]]
    merged = data.merge(split, on="pid", how="inner", validate="one_to_one")
    names = {c: _identifier(c) for c in data.columns if c not in ("pid", "T", "E")}
    merged = merged.rename(columns={**names, "T": "time", "E": "event"})
    merged["event"] = merged["event"].astype(np.int64)
    frames, read, excluded = {}, {}, {}
    for region, frame in merged.groupby("region", sort=True):
        site = f"region_{region}"
        frames[site] = frame.drop(columns=["pid", "region"]).reset_index(drop=True)
        read[site] = len(frame)
        excluded[site] = 0
    missing = len(data) - len(merged)
    if missing:
        excluded["(no region)"] = missing
        read["(no region)"] = missing
    return SiteFrames(
        frames, read, excluded, "not in FLamby's train/test split", TCGA_CITATION, folder
    )


def _identifier(name: str) -> str:
    text = "".join(ch if ch.isalnum() else "_" for ch in name.lower())
    return "_".join(part for part in text.split("_") if part)


def _read_uci(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise DataFileError(f"{path.parent}: {path.name} not found")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            fields = line.strip().split(",")
            if len(fields) != len(HEART_COLUMNS):
                raise DataFileError(
                    f"{path}, line {line_no}: {len(fields)} fields, expected {len(HEART_COLUMNS)}"
                )
            values = []
            for column, text in zip(HEART_COLUMNS, fields, strict=True):
                if text.strip() == "?":
                    values.append(np.nan)
                    continue
                try:
                    value = float(text)
                except ValueError:
                    value = math.nan
                if not math.isfinite(value):
                    raise DataFileError(
                        f"{path}, line {line_no}, field {column!r}: {text!r} is not a finite "
                        "number or '?' (the file's code for missing)"
                    )
                values.append(value)
            rows.append(values)
    return pd.DataFrame(rows, columns=HEART_COLUMNS)


def synthetic_logistic(
    n_sites: int = 10,
    n_per_site: int | list[int] = 500,
    n_covariates: int = 4,
    *,
    seed: int,
    categorical: bool = True,
) -> dict[str, pd.DataFrame]:
    """A multi-site logistic dataset with site-specific covariate shifts.

    Covariates ``x1..xk`` are normal with a site-specific mean shift; ``group``
    (levels ``a``, ``b``, ``c``, site-specific frequencies) when ``categorical``;
    outcome ``y ~ Bernoulli(expit(-0.5 + sum_j b_j x_j + group effect))``.
    """
    rng = np.random.default_rng(seed)
    sizes = [n_per_site] * n_sites if isinstance(n_per_site, int) else list(n_per_site)
    if len(sizes) != n_sites:
        raise ValueError("n_per_site must be an int or a list with one size per site")
    slopes = rng.normal(0.0, 0.5, n_covariates)
    group_effect = {"a": 0.0, "b": 0.4, "c": -0.6}
    frames = {}
    for s, n in enumerate(sizes):
        shift = rng.normal(0.0, 0.5, n_covariates)
        X = rng.normal(shift, 1.0, size=(n, n_covariates))
        eta = -0.5 + X @ slopes
        frame = pd.DataFrame(X, columns=[f"x{j + 1}" for j in range(n_covariates)])
        if categorical:
            weights = rng.dirichlet([4.0, 4.0, 4.0])
            group = rng.choice(["a", "b", "c"], size=n, p=weights)
            eta = eta + np.vectorize(group_effect.get)(group)
            frame["group"] = group
        frame["y"] = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(np.int64)
        frames[f"site{s + 1:02d}"] = frame
    return frames
