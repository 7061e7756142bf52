"""The compliance report as a privacy officer reads it: on the page, in words, with a verdict.

Checked on the PDF text (``pdftotext``, poppler) and the HTML of two studies:
the demo study (record- and client-level privacy, ledgers) and a study
recorded as ``fedstats study run`` records a Flower run (no ledger, a
survival table as a diagnostic). Every word lies on its A4 page; no Python
repr or raw record field name reaches the text; the verdict names every scope
and its budget outcome; every table has a row; the contents are links that
resolve in the HTML and in the PDF.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from headless_chromium import load_page
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import accounting
from reports import build_report, render_html
from reports.labels import FIELD_LABELS, field_label, is_labelled, settings, value_text
from reports.study import Study
from reports.verdict import verdict

A4 = (595.28, 841.89)
"""A4 in PostScript points (210 x 297 mm)."""
A4_LANDSCAPE = A4[::-1]
"""Appendix A (the ledger, ten columns) is set on landscape A4 pages."""
SNAKE = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b")
REPRS = {
    "dict or set literal": re.compile(r"\{'|'\}|\{\"|\": "),
    "None": re.compile(r"\bNone\b"),
    "True / False": re.compile(r"\b(?:True|False)\b"),
    "list of numbers": re.compile(r"\[\s*-?\d"),
    "indexed field name": re.compile(r"\b[a-z]+_[a-z_]+\["),
    "fixed-effect field suffix": re.compile(r"_fe\b"),
}
WORD = re.compile(
    r'<word xMin="([-\d.]+)" yMin="([-\d.]+)" xMax="([-\d.]+)" yMax="([-\d.]+)">(.*?)</word>'
)
LIBRARY_NAMES = {"dp_accounting"}
"""Python package names the report cites in its fixed prose."""


@pytest.fixture(scope="module", params=["demo", "flower-like"])
def case(request, demo_study, rendered, flower_like_study, rendered_flower_like) -> dict:
    if request.param == "demo":
        return {"study": demo_study, **rendered}
    return {"study": flower_like_study, **rendered_flower_like}


def _pdftotext(pdf: Path, *options: str) -> str:
    return subprocess.run(
        ["pdftotext", *options, str(pdf), "-"], check=True, capture_output=True, text=True
    ).stdout


# --- what the study recorded, read from its files (not through reports) -----------------------


def _walk(tree: Any, keys: set[str], words: set[str]) -> None:
    if isinstance(tree, dict):
        for key, value in tree.items():
            keys.add(str(key))
            if key == "params" and isinstance(value, dict):
                words.update(value)  # a fit's terms are names the formula defined
            _walk(value, keys, words)
    elif isinstance(tree, list | tuple):
        for value in tree:
            _walk(value, keys, words)
    elif isinstance(tree, str):
        words.update(SNAKE.findall(tree))


def recorded_names(study: Path) -> tuple[set[str], set[str]]:
    """``(field names, names the study itself defined)`` in a study directory.

    Field names are the keys of every recorded mapping (configuration, fit,
    curve, diagnostic and harmonisation records, ledger parameters) and the
    diagnostics' columns. Names the study defined are the snake_case words of
    its recorded values and texts: sites, fits, terms and covariates, the
    specification, recorded notes and descriptions (the report may quote those).
    """
    keys: set[str] = set()
    words: set[str] = set(SNAKE.findall((study / "spec.toml").read_text(encoding="utf-8")))
    for path in study.rglob("*.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        if path.parent.name == "diagnostics":  # its columns are field names, not values
            keys.update(record.pop("columns", []))
        _walk(record, keys, words)
    inventory = study / "inventory.jsonl"
    if inventory.exists():
        for line in inventory.read_text(encoding="utf-8").splitlines():
            _walk(list(json.loads(line).values()), set(), words)
    for path in sorted((study / "ledgers").glob("*.ledger")):
        with accounting.Ledger(path) as ledger:
            for scope in ledger.scopes():
                words.add(scope.owner)
                for entry in ledger.entries(scope):
                    keys.update(entry.parameters or {})
                    _walk([entry.analysis, entry.task, entry.note], set(), words)
    return keys, words


def raw_names(text: str, field_names: set[str], defined: set[str]) -> set[str]:
    """snake_case words in ``text`` that the study did not define itself, and raw field names."""
    tokens = set(SNAKE.findall(text))
    raw_fields = {
        k
        for k in field_names
        if ("_" in k or "[" in k)
        and k not in defined
        and re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", text)
    }
    return (tokens - defined - LIBRARY_NAMES) | raw_fields


# --- the page ----------------------------------------------------------------------------------


def test_every_word_of_the_pdf_lies_on_its_a4_page(case):
    """``pdftotext -bbox``: every page is A4 (portrait; landscape for the ledger appendix only)
    and every word box lies inside its page (a table wider than the page puts words beyond
    its width)."""
    bbox = _pdftotext(case["pdf"], "-bbox")
    pages = re.findall(r'<page width="([\d.]+)" height="([\d.]+)">(.*?)</page>', bbox, re.S)
    assert pages
    outside = []
    landscape = []
    for number, (width, height, body) in enumerate(pages, start=1):
        size = (float(width), float(height))
        if size == pytest.approx(A4_LANDSCAPE, abs=0.5):
            landscape.append(number)
        else:
            assert size == pytest.approx(A4, abs=0.5), number
        for x0, y0, x1, y1, word in WORD.findall(body):
            if float(x0) < 0 or float(y0) < 0 or float(x1) > size[0] or float(y1) > size[1]:
                outside.append((number, word, x1))
    assert outside == [], outside[:20]
    if landscape:  # one run of pages, opening with the ledger appendix's heading
        assert landscape == list(range(landscape[0], landscape[-1] + 1)), landscape
        words = [w for *_, w in WORD.findall(pages[landscape[0] - 1][2])]
        assert words[:3] == ["Appendix", "A.", "The"] or "Appendix" in words[:12], words[:12]


def test_the_page_check_catches_a_table_wider_than_the_page(tmp_path):
    """The same measurement on a PDF with an unbreakable row wider than A4 finds words outside."""
    import weasyprint

    pdf = tmp_path / "wide.pdf"
    cells = "".join(
        f"<td style='white-space: nowrap'>column{i}_value_{i:04d}</td>" for i in range(12)
    )
    weasyprint.HTML(string=f"<table><tr>{cells}</tr></table>").write_pdf(pdf)
    boxes = re.findall(r'xMax="([\d.]+)"', _pdftotext(pdf, "-bbox"))
    assert max(float(x) for x in boxes) > A4[0]


def test_pdf_pages_and_the_html_screenshot_render(case, tmp_path):
    """Pages at 60 dpi (``pdftoppm``) and the HTML in headless Chromium: A4 portrait PNGs with
    ink, and a screenshot without console errors."""
    subprocess.run(
        ["pdftoppm", "-r", "60", "-png", str(case["pdf"]), str(tmp_path / "page")], check=True
    )
    pages = sorted(tmp_path.glob("page-*.png"))
    assert pages
    for page in pages:
        with Image.open(page) as image:
            # A4 at 60 dpi: portrait, or landscape for the ledger appendix
            assert image.size in (
                pytest.approx((496, 702), abs=2),
                pytest.approx((702, 496), abs=2),
            )
            assert image.convert("L").getextrema()[0] < 100
    assert load_page(case["html"], tmp_path / "html.png") == []


# --- words, not reprs --------------------------------------------------------------------------


def test_pdf_text_has_no_python_repr(case):
    text = " ".join(_pdftotext(case["pdf"]).split())
    found = {name: pattern.findall(text)[:5] for name, pattern in REPRS.items()}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_no_raw_field_name_reaches_the_pdf_text(case):
    field_names, defined = recorded_names(case["study"])
    assert len(field_names) > 10  # the study records fields the report shows
    text = " ".join(_pdftotext(case["pdf"]).split())
    assert raw_names(text, field_names, defined) == set()


def test_the_field_name_check_catches_a_raw_field_name(demo_study):
    field_names, defined = recorded_names(demo_study)
    assert {"max_level_density", "estimate_fe", "i2_untruncated"} <= field_names - defined
    text = "largest share of levels 0.33; max_level_density = 0.33; estimate_fe -0.61"
    assert raw_names(text, field_names, defined) == {"max_level_density", "estimate_fe"}


def test_every_recorded_field_has_its_own_label(demo_study, flower_like_study):
    """A field the report shows (settings, ledger parameters, disclosure thresholds,
    secure-aggregation facts, diagnostic columns) needs an entry in FIELD_LABELS."""
    for study in (demo_study, flower_like_study):
        loaded = Study.load(study)
        shown = set(loaded.configuration.get("disclosure") or {})
        for options in (loaded.configuration.get("privacy") or {}).values():
            shown |= set(options) | set(options.get("secure_aggregation") or {})
        for record in loaded.scopes:
            for entry in record.entries:
                shown |= set(entry.parameters or {})
        for fit in loaded.fits:
            shown |= set(getattr(fit.result.privacy, "secure_aggregation", None) or {})
        for diagnostic in loaded.diagnostics.values():
            shown |= set(diagnostic.columns)
        assert shown
        assert sorted(f for f in shown if not is_labelled(f)) == []


FIELD = st.from_regex(r"[a-z][a-z0-9]{0,8}(_[a-z0-9]{1,8}){0,3}(\[[a-z_]{1,8}\])?", fullmatch=True)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(FIELD, inner, max_size=4),
    max_leaves=12,
)


@given(FIELD)
def test_a_field_label_never_shows_an_underscore_or_bracket(field):
    assert "_" not in field_label(field) and "[" not in field_label(field)


@given(st.dictionaries(FIELD, JSON, max_size=6))
def test_recorded_values_are_written_without_python_syntax(options):
    """Whatever a configuration records, its settings read without reprs or raw names."""
    for label, value in settings(options):
        written = f"{label}: {value}"
        assert "_" not in label
        assert not re.search(r"\{'|\bNone\b|\bTrue\b|\bFalse\b|\[", written.replace(value, "")), (
            written
        )
        if "'" not in str(options):
            assert "{'" not in value and "None" not in value.split() and "[" not in value


def test_bounds_read_as_ranges_and_unset_options_are_explained():
    rows = dict(
        settings({"bounds": {"age": [18.0, 110.0]}, "noise_multiplier": None, "kind": "ClientDP"})
    )
    assert rows[FIELD_LABELS["bounds"]] == "age 18–110"
    assert rows[FIELD_LABELS["noise_multiplier"]].startswith("calibrated from ε and δ")
    assert rows[FIELD_LABELS["kind"]] == "client-level differential privacy"
    assert value_text({"dropouts": [], "threshold": 4}) == (
        "sites that dropped out none; threshold (sites that must take part) 4"
    )


def test_noisy_counts_are_rounded_and_client_level_counts_are_called_exact(demo_study, rendered):
    loaded = Study.load(demo_study)
    report = build_report(loaded)
    fits = {f.name: f for f in report.fits}
    assert fits["logistic-record-dp"].counts_noisy
    assert not fits["logistic-client-dp"].counts_noisy
    text = " ".join(_pdftotext(rendered["pdf"]).split())
    noisy = loaded.fit("logistic-record-dp").result.provenance.n_obs
    assert all(n != round(n) for n in noisy.values())  # the released counts carry noise
    for site, n in noisy.items():
        assert f"{site} {round(n):,}" in text
    assert "noisy counts, released under record-level privacy and rounded" in text
    assert "exact counts: under client-level privacy" in text
    assert "clipping bound on each site's score" in text and "by not applicable" not in text


# --- verdict, claim, tables, links -------------------------------------------------------------


def test_the_verdict_names_every_scope_its_guarantee_and_the_budget_outcome(demo_study):
    report = build_report(Study.load(demo_study))
    html = render_html(report)
    owners = {s.owner for s in report.scopes}
    assert set(report.verdict.within_budget) == owners and report.verdict.over_budget == ()
    first_page = html[: html.index('<h2 id="claim">')]
    paragraph = re.search(r'<div class="verdict" id="verdict"><p>(.*?)</p>', first_page, re.S)
    assert paragraph
    text = paragraph.group(1)
    assert all(owner in text for owner in owners)
    assert "Record-level guarantee" in text and "Client-level guarantee" in text
    assert "Every scope stayed within its budget" in text
    for s in report.scopes:
        assert f"ε = {s.epsilon_rdp:#.4g}" in text and f"{s.budget_epsilon:#.4g}" in text
    assert "fixed seed" in text  # the fixture fixed the noise


def test_the_verdict_names_a_scope_over_its_budget(demo_study):
    report = build_report(Study.load(demo_study))
    scopes = tuple(
        replace(s, epsilon_rdp=s.budget_epsilon + 0.5) if s.owner == "east" else s
        for s in report.scopes
    )
    result = verdict(replace(report, scopes=scopes))
    assert result.over_budget == ("east",)
    assert "Not every site stayed within its budget: east 3.500 of 3.000 exceeded it" in (
        result.text
    )
    assert "Every scope stayed within" not in result.text


def test_a_study_without_ledgers_says_so_in_its_verdict(flower_like_study):
    report = build_report(Study.load(flower_like_study))
    assert not report.verdict.ledgers_recorded
    assert "No privacy ledger is recorded with this study" in report.verdict.text
    assert "Site ledgers stay at the sites" in report.verdict.text
    assert "event_logistic" in report.verdict.text  # the exact fit, without a DP guarantee


def test_the_claim_is_one_paragraph_with_a_row_per_scope(demo_study, rendered):
    report = build_report(Study.load(demo_study))
    html = rendered["html"].read_text(encoding="utf-8")
    claim = html[html.index('<h2 id="claim">') : html.index('<h2 id="unit">')]
    assert claim.count("<p>") == 1
    for s in report.scopes:
        row = (
            f"<tr><td>{s.owner}</td><td>{s.level}</td><td>one {s.unit}</td>"
            f'<td>{s.neighbouring}</td><td class="n">{s.epsilon_rdp:#.4g}</td>'
            f'<td class="n">{s.epsilon_pld:#.4g}</td><td class="n">{s.delta:.3g}</td>'
            f'<td class="n">{s.budget_epsilon:#.4g}</td>'
        )
        assert row in claim, s.owner


class _Tables(HTMLParser):
    """Counts the data cells of each table body, and collects ids and internal links."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[int] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"])
        if tag == "a" and (found.get("href") or "").startswith("#"):
            self.links.append(found["href"][1:])
        if tag == "table":
            self._open.append(len(self.tables))
            self.tables.append(0)
        elif tag == "td" and self._open:
            self.tables[self._open[-1]] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._open.pop()


def test_no_table_is_empty(case):
    parser = _Tables()
    parser.feed(case["html"].read_text(encoding="utf-8"))
    assert parser.tables and all(cells > 0 for cells in parser.tables), parser.tables


def test_the_flower_like_report_says_why_its_sections_have_no_rows(rendered_flower_like):
    html = rendered_flower_like["html"].read_text(encoding="utf-8")
    assert "No budget is recorded: the study directory holds no privacy ledger." in html
    assert "No privacy scope is recorded (no ledger)" in html
    assert "No ledger entry is recorded with this study." in html


def test_the_contents_are_links_to_ids_in_the_html_and_the_pdf(case):
    """HTML: every contents entry is an ``<a href="#id">`` to an element with that id. PDF:
    every id is a named destination (``pdfinfo -dests``) and each contents link on page 1
    (``pdftohtml -xml``) goes to its destination's page."""
    html = case["html"].read_text(encoding="utf-8")
    parser = _Tables()
    parser.feed(html)
    expected = {
        "claim", "unit", "budgets", "mechanisms", "trust", "flows", "harmonisation",
        "results", "hazards", "reproducibility", "ledger", "messages",
    }  # fmt: skip
    assert expected <= set(parser.links) <= parser.ids
    dests = subprocess.run(
        ["pdfinfo", "-dests", str(case["pdf"])], check=True, capture_output=True, text=True
    ).stdout
    destination = {
        name: int(page) for page, name in re.findall(r'^\s*(\d+) \[.*"(.*)"$', dests, re.M)
    }
    assert set(parser.links) <= set(destination)
    xml = subprocess.run(
        ["pdftohtml", "-xml", "-i", "-stdout", "-f", "1", "-l", "1", str(case["pdf"])],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pdf_links = re.findall(r'<a href="[^"#]*#(\d+)">([^<]+)</a>', xml)
    nav = html[html.index("<nav>") : html.index("</nav>")]
    entries = re.findall(r'<a href="#([\w-]+)">([^<]+)</a>', nav)
    assert len(entries) == len(expected)
    for anchor, title in entries:
        pages = [int(page) for page, text in pdf_links if text == title]
        assert pages == [destination[anchor]], (anchor, title, pages)


def test_the_epsilon_plot_labels_each_budget_cap(demo_study, monkeypatch):
    """The plot's caps are annotated with their value and the scopes they cap, and each
    scope's line is in the legend (the figure's texts, read as it is saved)."""
    import matplotlib.figure

    from reports.plots import epsilon_timeline

    report = build_report(Study.load(demo_study))
    texts: list[str] = []
    save = matplotlib.figure.Figure.savefig

    def reading_texts(figure, *args, **kwargs):
        for ax in figure.axes:
            texts.extend(t.get_text() for t in ax.texts)
            texts.extend(t.get_text() for t in ax.get_legend().get_texts())
        return save(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", reading_texts)
    assert epsilon_timeline(
        [(s.owner, s.level, s.timeline, s.budget_epsilon) for s in report.scopes]
    )
    assert "budget cap ε = 4.000: coordinator" in texts
    assert "budget cap ε = 3.000: east, north, south, west" in texts
    assert "east (record-level): spent" in texts
