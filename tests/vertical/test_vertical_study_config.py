"""study.toml ``[[links]]`` and ``vertical_logistic`` fits, and a site's ``[data] identifiers``:
every malformed entry is a ConfigError naming the table and key, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedstats.errors import ConfigError
from fedstats.jobs.site_batch import SiteExit, run_site_job
from fedstats.jobs.site_serving import ServeResult
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_links import study_linkage_table
from tests.vertical.vertical_study import write_spec

LINK = {"id": "L1", "first": "registry", "second": "hospital"}
VERTICAL = {
    "kind": "vertical_logistic",
    "name": "v",
    "formula": "y ~ x",
    "outcome_site": "registry",
    "covariate_sites": ["hospital"],
    "linkage": ["L1"],
}


def study(tmp_path: Path, *, links=(LINK,), fit=VERTICAL, spec: bool = True) -> dict[str, Any]:
    section = {"name": "s", "sites": ["registry", "hospital", "other"], "out": "out"}
    if spec:
        section["spec"] = str(tmp_path / "spec.toml")
    return {"study": section, "links": [dict(e) for e in links], "fits": [dict(fit)]}


def load(tmp_path: Path, config: dict[str, Any]):
    path = tmp_path / "study.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return load_study_config(path)


def test_a_valid_vertical_study_loads(tmp_path: Path) -> None:
    config = load(tmp_path, study(tmp_path))
    assert [e.id for e in config.links] == ["L1"] and config.fits[0].linkage == ["L1"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c: c["links"][0].update(second="registry"), "links.0"),
        (lambda c: c["links"][0].update(second="elsewhere"), "links"),
        (lambda c: c["links"].append(dict(LINK)), "links"),
        (lambda c: c["links"][0].pop("first"), "links.0.first"),
        (lambda c: c["links"][0].update(id="../x"), "links.0.id"),
        (lambda c: c["links"][0].update(secret="x"), "links.0.secret"),
        (lambda c: c["study"].pop("spec"), "links"),
        (lambda c: c["fits"][0].update(linkage=["L2"]), "fits"),
        (lambda c: c["fits"][0].update(linkage=["L1", "L1"]), "fits.0.vertical_logistic"),
        (lambda c: c["fits"][0].update(covariate_sites=["registry"]), "fits.0.vertical_logistic"),
        (lambda c: c["fits"][0].update(covariate_sites=["other"]), "fits"),
        (lambda c: c["fits"][0].update(outcome_site="nowhere"), "fits"),
        (lambda c: c["fits"][0].pop("outcome_site"), "fits.0.vertical_logistic.outcome_site"),
        (lambda c: c["fits"][0].update(maxiter=0), "fits.0.vertical_logistic.maxiter"),
    ],
)
def test_a_malformed_link_or_vertical_fit_names_the_table_and_key(
    tmp_path: Path, change, named: str
) -> None:
    config = study(tmp_path)
    change(config)
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, config)
    assert f"field '{named}" in str(raised.value), str(raised.value)


LINK_KEYS = ["id", "first", "second", "extra"]
FIT_KEYS = ["formula", "outcome_site", "covariate_sites", "linkage", "maxiter", "extra"]
TOML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=5,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    where=st.sampled_from([("links", k) for k in LINK_KEYS] + [("fits", k) for k in FIT_KEYS]),
    value=TOML_VALUES,
)
def test_any_value_in_a_link_or_vertical_fit_loads_or_names_its_table(
    tmp_path: Path, where: tuple[str, str], value: Any
) -> None:
    """Any TOML value under any key of a [[links]] or vertical fit table: it loads, or a
    ConfigError names the table (never another exception)."""
    config = study(tmp_path)
    table, key = where
    if value is None:
        config[table][0].pop(key, None)
    else:
        config[table][0][key] = value
    try:
        text = tomli_w.dumps(config)
    except (TypeError, ValueError):
        return  # not representable in TOML (a None inside a list); nothing to test
    (tmp_path / "study.toml").write_text(text, encoding="utf-8")
    try:
        load_study_config(tmp_path / "study.toml")
    except ConfigError as error:
        assert f"field '{table}" in str(error), str(error)


def test_the_links_schema_is_the_study_specs_linkage_table(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.toml")
    config = load(tmp_path, study(tmp_path))
    assert study_linkage_table(config)["threshold"] == 0.9
    (tmp_path / "spec.toml").write_text(
        (tmp_path / "spec.toml").read_text().split("[linkage]")[0], encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"field 'study.spec'.*no \[linkage\] table"):
        study_linkage_table(config)


# ---------------------------------------------------------------- a site's [data] identifiers


def no_request(config, path, journal) -> ServeResult:
    return ServeResult("no request", 0.0, [])


def ready_site(tmp_path: Path, identifiers: Any = None, **data: Any) -> Path:
    """A site with a ready frame of three patients, the spec, and an identifier file."""
    frame = pd.DataFrame({"y": [0, 1, 0] * 5}, index=[f"P{i}" for i in range(15)])
    frame.to_parquet(tmp_path / "frame.parquet")
    write_spec(tmp_path / "spec.toml")
    table = pd.DataFrame(
        {
            "given_name": ["anna"] * 15,
            "family_name": ["smith"] * 15,
            "birth_date": ["1950-01-02"] * 15,
            "sex": ["female"] * 15,
            "postal_code": ["AB12"] * 15,
        },
        index=frame.index,
    )
    path = tmp_path / "identifiers.parquet"
    if identifiers is None:
        table.to_parquet(path)
    elif callable(identifiers):
        identifiers(table, path)
    config = {
        "site": {"name": "hospital", "workdir": str(tmp_path / "work")},
        "data": {
            "frame": str(tmp_path / "frame.parquet"),
            "identifiers": str(path),
            "spec": str(tmp_path / "spec.toml"),
            **data,
        },
        "privacy": {"ledger": str(tmp_path / "site.ledger")},
        "disclosure": {"verified_paths": False},
        "coordinator": {"superlink": "127.0.0.1:9", "insecure": True},
    }
    site = tmp_path / "site.toml"
    site.write_text(tomli_w.dumps(config), encoding="utf-8")
    return site


def test_a_ready_frame_serves_with_the_identifier_table_it_names(tmp_path: Path) -> None:
    run = run_site_job(ready_site(tmp_path), serve=no_request)
    assert run.exit_code == SiteExit.OK, run.reason
    assert "smith" not in (tmp_path / "work" / "runs").iterdir().__next__().read_text()


@pytest.mark.parametrize(
    ("write", "words"),
    [
        (lambda t, p: None, "does not exist"),
        (lambda t, p: p.write_bytes(b"given_name,family_name\nanna,smith\n"), "not a readable"),
        (lambda t, p: t.drop(columns="sex").to_parquet(p), "has columns"),
        (lambda t, p: t.assign(sex=1).to_parquet(p), "column 'sex', row 0: not text"),
        (lambda t, p: t.iloc[:-1].to_parquet(p), "one row for each patient"),
        (lambda t, p: t.assign(given_name="Anna").to_parquet(p), "given_name"),
    ],
)
def test_a_bad_identifier_file_stops_the_job_naming_the_field_and_file(
    tmp_path: Path, write, words: str
) -> None:
    run = run_site_job(ready_site(tmp_path, identifiers=write), serve=no_request)
    assert run.exit_code == SiteExit.CONFIGURATION, run.reason
    assert "data.identifiers" in run.reason and "identifiers.parquet" in run.reason, run.reason
    assert words in run.reason, run.reason
    assert "smith" not in run.reason.lower() and "anna" not in run.reason.lower()


def test_identifiers_without_a_ready_frame_or_beside_a_spec_without_linkage_are_refused(
    tmp_path: Path,
) -> None:
    site = ready_site(tmp_path)
    text = site.read_text().replace('frame = "', 'omop = "')
    (tmp_path / "bad.toml").write_text(text, encoding="utf-8")
    run = run_site_job(tmp_path / "bad.toml", serve=no_request)
    assert run.exit_code == SiteExit.CONFIGURATION and "'data'" in run.reason, run.reason
    (tmp_path / "spec.toml").write_text(
        (tmp_path / "spec.toml").read_text().split("[linkage]")[0], encoding="utf-8"
    )
    run = run_site_job(site, serve=no_request)
    assert run.exit_code == SiteExit.CONFIGURATION and "no [linkage] table" in run.reason
