"""The report's survival-curve section says "not released" and why, never S = 1 "1 to 1".

Recorded Kaplan–Meier results on TCGA-BRCA as the study runs make them
(``fedstats.jobs.study_fits``: the example Flower study's yearly curves to
3650 days): six regions, where five stop before the first year; and the
Flower test study's three regions with deferred deaths, by nodal status,
whose curves read S = 1, "1 to 1", every year to 2,190 days (the pooled data
hold deaths there). The section must print "not released" with the sites and
their horizons, and no S = 1 with a zero-width interval where deaths are.
"""

from __future__ import annotations

import re
from html import unescape

import numpy as np
import pytest

from fedstats import Federation, SurvivalHorizonWarning, datasets
from fedstats.jobs.study_config import KaplanMeierFit
from fedstats.jobs.study_fits import make_fit
from reports import build_report, render_html
from reports.recorder import StudyRecorder
from reports.study import Study


def recorded_html(tmp_path, name: str, record: dict, description: str) -> str:
    """The report of a study holding one curve record, and that curve's section's HTML."""
    spec = tmp_path / "spec.toml"
    spec.write_text('[study]\nname = "brca"\ndescription = "TCGA-BRCA survival"\n')
    recorder = StudyRecorder(tmp_path / "study", study="brca")
    recorder.record_spec(spec)
    recorder.record_configuration({})
    recorder.record_curves(name, record, description=description)
    html = render_html(build_report(Study.load(recorder.finish())))
    start = html.index(f"<h4>{name}:")
    return re.sub(r"\s+", " ", html[start : html.index("<h3", start)])


def text(section: str) -> str:
    """The section's words, without tags."""
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", section)))


def rows(section: str) -> list[list[str]]:
    """The cells of each table row, as text."""
    return [
        [
            unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", section)
        if "<td" in row
    ]


def km_record(frames, **options) -> dict:
    fit = KaplanMeierFit(
        kind="kaplan_meier", name="survival", time="time", event="event", **options
    )
    """The record a study run writes (``make_fit``) and then records as curves
    (``fedstats.jobs.study_record``: every key but ``kind``)."""
    with pytest.warns(SurvivalHorizonWarning):  # the record keeps the warnings too
        record = make_fit(fit, Federation.in_process(frames))
    return {k: v for k, v in record.items() if k != "kind"}


def pooled_deaths_by(frames, grid, rows_of=lambda f: np.ones(len(f), bool)) -> list[int]:
    return [
        int(sum(((f.time <= g) & (f.event == 1) & rows_of(f)).sum() for f in frames.values()))
        for g in grid
    ]


def test_tcga_brca_yearly_curve_reads_not_released_naming_the_regions(tmp_path):
    frames = dict(datasets.tcga_brca().frames)
    record = km_record(frames, width=365, horizon=3650)
    section = recorded_html(tmp_path, "os", record, "overall survival, yearly")
    table = rows(section)
    assert len(table) == 10
    assert pooled_deaths_by(frames, [365])[0] >= 15
    assert all(row[1] == "not released" for row in table)
    assert not any(row[1] == "1" or row[2] == "1 to 1" for row in table)
    for region in range(5):
        assert f"region_{region} stop before the first grid time (365)" in table[0][2]
    assert "region_5" not in table[0][2]  # it reaches 365: not what stops the curve there
    words = text(section)
    assert "Not released from 365" in words
    assert "Median survival time not estimable: no value of the curve is released" in words
    assert record["horizon_warnings"]
    for warning in record["horizon_warnings"]:
        assert f"Not released: {warning}." in words
    assert "region_4 before the first grid time (365)" in words


def test_the_flower_studys_deferred_curves_by_nodal_status_do_not_read_one(tmp_path):
    """The Flower test study (regions 0 to 2, nodal status, deferred deaths): group 1 read
    S = 1, "1 to 1", at every year to 2,190 days before; now no year before its first released
    death shows a value, and the years past region_2's horizon (730) are not released."""
    frames = {
        s: f
        for s, f in datasets.tcga_brca().frames.items()
        if s in ("region_0", "region_1", "region_2")
    }
    record = km_record(
        frames, group="ajcc_pathologic_n_n0_i", width=365, horizon=3650, sparse_events="defer"
    )
    section = recorded_html(tmp_path, "survival_by_nodes", record, "by nodal status")
    grid = record["grid"]
    table = rows(section)
    assert len(table) == 2 * len(grid)
    for number, group in enumerate(("0", "1")):
        deaths = pooled_deaths_by(
            frames, grid, lambda f, g=int(group): f["ajcc_pathologic_n_n0_i"] == g
        )
        for row, dead in zip(
            table[number * len(grid) : (number + 1) * len(grid)], deaths, strict=True
        ):
            if dead:
                assert not (row[1] == "1" and row[2] == "1 to 1"), (group, row)
    assert record["horizons"]["region_2"] == {"0": 730.0, "1": 730.0}
    assert record["not_released_from"] == {"0": 1095.0, "1": 1095.0}
    words = text(section)
    assert "the counts of region_2 stop at 730 (their safe horizons)" in words
    assert "no death released yet" in words
    group_1 = table[len(grid) :]
    assert all(row[1] == "not released" for row in group_1)
    released_0 = [row for row in table[: len(grid)] if row[1] != "not released"]
    assert [row[0] for row in released_0] == ["730"]
