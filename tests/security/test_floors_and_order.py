"""Floors and order: a small-cell threshold below 2, unsafe names, and work done before refusing.

The attacks: ``k_cell = 1`` was accepted silently and switched the cell rules
and the differencing guard off (a cell of one patient is that patient); a site
or fit named ``.`` or ``..`` (or holding a path separator) became a folder name
outside the study's own; and requests with 100,000 agreed levels, a
268M-parameter network or a 64 MB header cost seconds and a gigabyte before
the site refused them.
"""

from __future__ import annotations

import pytest

from fedstats.errors import StudyConfigurationError
from fedstats.site.disclosure import DisclosurePolicy


@pytest.mark.parametrize("k_cell", [1, 0, -3, 1.5, 2.0, True, "3"])
def test_a_cell_threshold_below_two_is_refused_with_the_reason(k_cell):
    with pytest.raises(StudyConfigurationError, match="k_cell") as info:
        DisclosurePolicy(k_cell=k_cell)
    assert "one patient" in str(info.value) or "integer" in str(info.value)


def test_min_count_one_keeps_a_cell_threshold_of_two():
    """``min_count = 1`` (the threshold rule off) does not switch the cell rules off."""
    assert DisclosurePolicy(min_count=1).k_cell == 2
    assert DisclosurePolicy().k_cell == 3
    assert DisclosurePolicy(k_cell=2).k_cell == 2


def test_site_toml_refuses_k_cell_one(tmp_path):
    from fedstats.errors import ConfigError
    from fedstats.jobs.site_config import load_site_config

    frame = tmp_path / "frame.parquet"
    frame.write_bytes(b"")
    (tmp_path / "site.toml").write_text(
        '[site]\nname = "region_1"\nworkdir = "work"\n'
        '[data]\nframe = "frame.parquet"\n'
        '[privacy]\nledger = "site.ledger"\n'
        "[disclosure]\nk_cell = 1\n"
    )
    with pytest.raises((ConfigError, StudyConfigurationError), match="k_cell"):
        load_site_config(tmp_path / "site.toml")


UNSAFE_NAMES = [
    ".", "..", "../x", "a/b", "a\\b", ".hidden", "-x", "_x", "a\nb", "C:", "", "x" * 101
]  # fmt: skip


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_a_silo_refuses_an_unsafe_site_name(name):
    import pandas as pd

    from fedstats.site.silo import Silo

    with pytest.raises(StudyConfigurationError, match="site name"):
        Silo(name, pd.DataFrame({"x": [1.0, 2.0]}))


def _toml(text: str) -> str:
    import json

    return json.dumps(text)  # a TOML basic string


@pytest.mark.parametrize("name", [".", "..", "../up", "a/b", ".x", "-x"])
def test_site_toml_refuses_an_unsafe_site_name_naming_the_file_and_field(tmp_path, name):
    from fedstats.errors import ConfigError
    from fedstats.jobs.site_config import load_site_config

    path = tmp_path / "site.toml"
    path.write_text(
        f'[site]\nname = {_toml(name)}\nworkdir = "work"\n'
        '[data]\nframe = "frame.parquet"\n[privacy]\nledger = "site.ledger"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_site_config(path)
    assert str(path) in str(info.value) and "site.name" in str(info.value)
    assert "starting with a letter or digit" in str(info.value)


STUDY = """[study]
name = {study}
sites = [{site}]
out = "out"

[coordinator]
superlink = "127.0.0.1:8000"
insecure = true

[[fits]]
kind = "logistic"
name = {fit}
formula = "y ~ x"
"""


@pytest.mark.parametrize(
    ("where", "field"),
    [("study", "study.name"), ("site", "study.sites"), ("fit", "fits.0")],
)
@pytest.mark.parametrize("name", [".", "..", "../up", "a/b"])
def test_study_toml_refuses_unsafe_study_site_and_fit_names(tmp_path, where, field, name):
    from fedstats.errors import ConfigError
    from fedstats.jobs.study_config import load_study_config

    names = {"study": _toml("s1"), "site": _toml("region_0"), "fit": _toml("fit_1")}
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(**names))
    load_study_config(path)  # the honest file reads
    path.write_text(STUDY.format(**{**names, where: _toml(name)}))
    with pytest.raises(ConfigError) as info:
        load_study_config(path)
    assert str(path) in str(info.value) and field in str(info.value)


@pytest.mark.parametrize("name", [".", "..", "../up", ".x"])
def test_the_recorder_refuses_unsafe_fit_and_site_names(tmp_path, name):
    from reports.errors import RecordingError
    from reports.layout import checked_name

    with pytest.raises(RecordingError, match="starting with a letter or digit"):
        checked_name("fit", name)
    assert checked_name("fit", "fit_1.v2") == "fit_1.v2"
