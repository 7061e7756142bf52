"""Labels from a study's records are shown literally in the report, whatever their characters.

The attack: a categorical level such as ``$\\undefinedcommand{x}$`` becomes a term name
(``C(x)[T.$\\undefinedcommand{x}$]``); matplotlib read it as mathtext and the report
builder failed, so neither the HTML nor the PDF was made. Markup in a label (``<script>``,
a Jinja expression, ``%``, a newline) must not become markup either.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from reports import build_report, write_html, write_pdf
from reports.study import Study

NASTY = ["$\\undefinedcommand{x}$", "<script>alert(1)</script>", "{{ 7 * 7 }}", "100%", "a\nb"]


def renamed(value, names: dict[str, str]):
    """``value`` with every dict key in ``names`` renamed (term names are keys of a record)."""
    if isinstance(value, dict):
        return {names.get(k, k): renamed(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, names) for v in value]
    return value


def with_nasty_labels(study: Path) -> list[str]:
    """Give every recorded fit's terms a level label from :data:`NASTY` and its description
    all of them; returns the new term names."""
    records = {path: json.loads(path.read_text()) for path in sorted(study.glob("fits/*.json"))}
    terms = sorted({t for r in records.values() for t in r["result"]["params"] if t != "Intercept"})
    names = {t: f"{t}[{NASTY[i % len(NASTY)]}]" for i, t in enumerate(terms)}
    for path, record in records.items():
        record["result"] = renamed(record["result"], names)
        record["description"] = f"{record.get('description', '')} " + " ".join(NASTY)
        path.write_text(json.dumps(record))
    return list(names.values())


def test_labels_with_mathtext_markup_and_templates_render_literally(study_copy, tmp_path):
    labels = with_nasty_labels(study_copy)
    assert any("undefinedcommand" in label for label in labels)
    report = build_report(Study.load(study_copy))
    html = write_html(report, tmp_path / "report.html").read_text(encoding="utf-8")
    pdf = write_pdf(report, tmp_path / "report.pdf")
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "{{ 7 * 7 }}" in html and "$\\undefinedcommand{x}$" in html and "100%" in html
    text = subprocess.run(
        ["pdftotext", str(pdf), "-"], check=True, capture_output=True, text=True
    ).stdout
    assert "\\undefinedcommand{x}" in text and "<script>alert(1)</script>" in text
    assert "{{ 7 * 7 }}" in text and "100%" in text


def test_a_kaplan_meier_figure_shows_a_mathtext_level_literally(tmp_path):
    import io

    import numpy as np
    import pandas as pd

    import fedstats

    rng = np.random.default_rng(0)
    frames = {
        f"s{i}": pd.DataFrame({
            "time": rng.exponential(5, 120).round(1) + 0.1,
            "event": (rng.random(120) < 0.7).astype(int),
            "group": rng.choice(["$\\undefinedcommand{x}$", "<b>plain</b>"], 120),
        })
        for i in range(2)
    }  # fmt: skip
    fed = fedstats.Federation.in_process(frames)
    fit = fedstats.KaplanMeier("time", "event", group="group", width=2.0, horizon=10.0).fit(fed)
    figure = fit.plot()
    figure.savefig(io.BytesIO(), format="png")  # drawing reads every text
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert "\\$\\undefinedcommand{x}\\$" in legend  # escaped: drawn as the dollars it holds
