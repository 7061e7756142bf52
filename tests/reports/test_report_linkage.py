"""The report's record-linkage section: what was encoded, the counts, and nothing suppressed.

A linkage record (``linkages/<id>.json``) is written with the writer's own check
(``studyfiles.linkage_records.checked_linkage_record``, as the linkage unit writes it)
into a study directory; the report must print its encoding (never a value), threshold,
blocking and what blocking shows, the secret's origin, the counts per site and the
score histogram, with every count of 1 to k - 1 shown as "< k" and no such count
recoverable by subtracting printed counts from the printed total. The oracle for
the latter is written here: a reader who knows every printed count, and that a
withheld bin holds at least k pairs and at least as many as any printed bin, must
find every value 1..k-1 of every suppressed bin possible.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from html import unescape
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports import StudyRecordError, build_report, render_html, write_pdf
from reports.recorder import StudyRecorder
from reports.study import Study
from studyfiles.linkage_records import checked_linkage_record, suppressed

K = 10
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SNAKE = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b")
REPRS = re.compile(r"\{'|'\}|\{\"|\": |\bNone\b|\b(?:True|False)\b|\[\s*-?\d")


def linkage_record(**changes) -> dict:
    """A linkage record as the linkage unit writes it (checked by the writer's check)."""
    base = dict(
        linkage_id="L1",
        created=datetime(2026, 11, 27, 9, 30, tzinfo=UTC).isoformat(),
        schema_fingerprint="ab" * 32,
        fields=[
            {"name": "given_name", "ngram": 2, "bits": 200, "positional": False},
            {"name": "family_name", "ngram": 2, "bits": 200, "positional": False},
            {"name": "birth_date", "ngram": 1, "bits": 300, "positional": True},
            {"name": "sex", "ngram": 1, "bits": 30, "positional": True},
            {"name": "postal_code", "ngram": 1, "bits": 150, "positional": True},
        ],
        length=1024,
        hash_type="blakeHash",
        xor_folds=1,
        threshold=0.55,
        blocking={
            "method": "keys",
            "keys": [
                {"field": "birth_date", "first": 4},
                {"field": "postal_code", "first": 3},
                {"field": "family_name", "first": 2},
            ],
        },
        secret="X25519 agreement signed with the sites' pinned roster keys",
        sites=[
            {"site": "registry", "role": "outcome", "records_sent": 5000, "linked": 4930,
             "never_compared": 0},
            {"site": "hospital", "role": "covariates", "records_sent": 4980, "linked": 4930,
             "never_compared": 12},
        ],
        pairs=4930,
        candidate_pairs=61234,
        score_edges=[0.55, 0.65, 0.75, 0.85, 0.95, 1.0],
        score_counts=[40, 310, 1200, 2880, 500],
        k=K,
    )  # fmt: skip
    return checked_linkage_record(base | changes)


def study_with(tmp_path: Path, *records: dict) -> Path:
    """A recorded study (spec and configuration only) holding the given linkage records."""
    spec = tmp_path / "spec.toml"
    spec.write_text('[study]\nname = "linked"\ndescription = "registry and hospital"\n')
    recorder = StudyRecorder(tmp_path / "study", study="linked")
    recorder.record_spec(spec)
    recorder.record_configuration({})
    root = recorder.finish()
    write_linkages(root, *records)
    return root


def write_linkages(root: Path, *records: dict) -> None:
    folder = root / "linkages"
    folder.mkdir(exist_ok=True)
    for record in records:
        (folder / f"{record['linkage_id']}.json").write_text(json.dumps(record))


def section(html: str) -> str:
    """The record-linkage section's HTML, images' data left out."""
    start = html.index('<h3 id="linkage">')
    part = html[start : html.index('<h2 id="harmonisation">', start)]
    return re.sub(r'src="data:[^"]*"', 'src=""', part)


def text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def table_rows(html: str, table_class: str) -> list[list[str]]:
    match = re.search(rf'<table class="{table_class}">(.*?)</table>', html, re.S)
    assert match, table_class
    return [
        [text(cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", match.group(1), re.S)
        if "<td" in row
    ]


def rendered_section(tmp_path: Path, *records: dict) -> str:
    return section(render_html(build_report(Study.load(study_with(tmp_path, *records)))))


def test_the_section_shows_what_was_encoded_and_the_counts(tmp_path):
    record = linkage_record()
    part = rendered_section(tmp_path, record)
    words = text(part)
    assert table_rows(part, "linkage-fields") == [
        ["given name", "2", "200 for the field", "no"],
        ["family name", "2", "200 for the field", "no"],
        ["birth date", "1", "300 for the field", "yes"],
        ["sex", "1", "30 for the field", "yes"],
        ["postal code", "1", "150 for the field", "yes"],
    ]
    assert "1,024 bits" in words and "keyed BLAKE2b" in words
    assert "folded onto itself by XOR" in words and "1: each encoding was made 2 times" in words
    assert "Dice similarity of at least 0.55 to link" in words
    assert (
        "birth date (first 4 characters), postal code (first 3 characters), family name "
        "(first 2 characters)" in words
    )
    assert "the size of every key value's group at each site" in words
    assert record["secret"] in words
    assert table_rows(part, "linkage-sites") == [
        ["registry", "registry (holds the outcome)", "5,000", "4,930", "0"],
        ["hospital", "hospital (holds covariates)", "4,980", "4,930", "12"],
    ]
    assert re.search(r"linked pairs\s*4,930\b", words)
    assert re.search(r"candidate pairs scored\s*61,234\b", words)
    assert table_rows(part, "linkage-scores") == [
        [f"{lo:.3g}", f"{hi:.3g}", f"{c:,}"]
        for lo, hi, c in zip(
            record["score_edges"], record["score_edges"][1:], record["score_counts"], strict=False
        )
    ]
    assert '<img class="plot" alt="Linked pairs of L1 by match score"' in part
    assert "Christen et al. 2017, 2018" in words and 'README, "Record linkage"' in words
    assert "heuristics, not guarantees" in words
    assert not SNAKE.findall(words) and not REPRS.search(words), words


def test_the_trust_model_names_the_linkage_unit_and_its_view(tmp_path):
    html = render_html(build_report(Study.load(study_with(tmp_path, linkage_record()))))
    trust = text(html[html.index('<h2 id="trust">') : html.index('<h2 id="flows">')])
    assert "linkage unit (the coordinator)" in trust
    assert "never a clear-text identifier nor the sites' shared secret" in trust


def test_double_hashing_and_unfolded_encodings_are_called_out(tmp_path):
    record = linkage_record(
        hash_type="doubleHash",
        xor_folds=0,
        blocking={"method": "bits", "tables": 24, "bits": 14, "seed": 0},
    )
    words = text(rendered_section(tmp_path, record))
    assert "Warning: double hashing admits few bit patterns" in words
    assert "Kroll and Steinmetzer" in words
    assert "none: an n-gram sets the same bit positions in every record" in words
    assert "24 tables of 14 bit positions each" in words
    assert "shows the linkage unit nothing it does not already hold" in words


def test_a_study_without_linkage_says_so(tmp_path):
    html = render_html(build_report(Study.load(study_with(tmp_path))))
    assert "No record linkage is recorded with this study." in section(html)
    assert "linkage unit (the coordinator)" not in html


# --- suppression --------------------------------------------------------------------------------


def reader_cannot_tell(printed: list[str], pairs: int) -> list[tuple[int, int]]:
    """``(bin, value)`` for each value 1..k-1 of a suppressed bin that the printed facts rule out.

    The reader knows the printed counts, the total ``pairs``, that a bin printed "< k"
    holds 1..k-1 pairs and that a withheld bin holds at least k pairs and at least as many
    as every printed bin. A value a of a suppressed bin is possible when the other
    suppressed bins (each 1..k-1) and the withheld ones (each >= m) can make up the rest.
    """
    small = [i for i, c in enumerate(printed) if c == f"< {K}"]
    held = [i for i, c in enumerate(printed) if c == "withheld"]
    shown = [int(c.replace(",", "")) for c in printed if c not in (f"< {K}", "withheld")]
    rest = pairs - sum(shown)
    floor = max([K, *shown])
    ruled_out = []
    for i in small:
        others = len(small) - 1
        for a in range(1, K):
            low, high = others, others * (K - 1)  # the other suppressed bins' sum
            withheld_sum = rest - a - low  # the withheld bins' sum, at its largest
            if (held and withheld_sum < len(held) * floor) or (
                not held and not low <= rest - a <= high
            ):
                ruled_out.append((i, a))
    return ruled_out


@SETTINGS
@given(
    true_counts=st.lists(st.integers(0, 60) | st.integers(1, K - 1), min_size=2, max_size=8).filter(
        lambda c: any(0 < x < K for x in c)
    ),
    unlinked=st.integers(0, 3 * K),
)
def test_no_suppressed_count_is_printed_or_follows_by_subtraction(
    tmp_path_factory, true_counts, unlinked
):
    """Counts 1..k-1 print as "< k"; no number from 1 to k-1 appears where a count is
    printed, and no suppressed bin's value follows from the total and the printed bins."""
    tmp_path = tmp_path_factory.mktemp("linkage")
    pairs = sum(true_counts)
    edges = [round(0.6 + 0.4 * i / len(true_counts), 6) for i in range(len(true_counts) + 1)]
    sent = pairs + unlinked
    record = linkage_record(
        pairs=suppressed(pairs, K),
        score_edges=edges,
        score_counts=[suppressed(c, K) for c in true_counts],
        sites=[
            {"site": "registry", "role": "outcome", "records_sent": suppressed(sent, K),
             "linked": suppressed(pairs, K), "never_compared": 0},
            {"site": "hospital", "role": "covariates", "records_sent": suppressed(pairs, K),
             "linked": suppressed(pairs, K), "never_compared": None},
        ],
    )  # fmt: skip
    part = rendered_section(tmp_path, record)
    sites = table_rows(part, "linkage-sites")
    counts = [cell for row in sites for cell in row[2:]]
    if re.search(r'<table class="linkage-scores">', part):
        printed = [row[2] for row in table_rows(part, "linkage-scores")]
        counts += printed
        for true, shown in zip(true_counts, printed, strict=True):
            if 0 < true < K:
                assert shown == f"< {K}"
            else:
                assert shown in (f"{true:,}", "withheld")
        if pairs >= K:
            assert reader_cannot_tell(printed, pairs) == []
    else:
        assert "any score histogram would let a reader work out" in text(part)
    total = re.search(r"linked pairs\s*</th>\s*<td[^>]*>(.*?)</td>", part).group(1)
    for cell in [*counts, unescape(total)]:
        numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", cell)]
        assert all(not 0 < n < K for n in numbers), (cell, counts)
    if 0 < unlinked < K and pairs >= K:  # sent - linked would be a small count
        assert sites[0][2] == f"withheld: fewer than {K} of its records are not linked"


def test_the_one_suppressed_bin_of_the_format_example_cannot_be_worked_out(tmp_path):
    """pairs 120 with bins (suppressed, 115): printing 115 would give the suppressed 5."""
    record = linkage_record(
        pairs=120,
        score_edges=[0.8, 0.9, 1.0],
        score_counts=[None, 115],
        sites=[
            {"site": "registry", "role": "outcome", "records_sent": 500, "linked": 120},
            {"site": "hospital", "role": "covariates", "records_sent": 300, "linked": 120},
        ],
    )
    part = rendered_section(tmp_path, record)
    assert [row[2] for row in table_rows(part, "linkage-scores")] == ["< 10", "withheld"]
    assert "115" not in text(part) and '<img class="plot"' not in part
    assert "withheld hold at least 10 pairs each" in text(part)


# --- malformed records --------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@SETTINGS
@given(
    field=st.sampled_from(
        ["length", "threshold", "xor_folds", "sites", "pairs", "score_counts", "k", "created"]
    ),
    value=JSON,
)
def test_a_malformed_linkage_record_is_named_with_its_field(tmp_path_factory, field, value):
    root = study_with(tmp_path_factory.mktemp("linkage"))
    record = linkage_record()
    path = root / "linkages" / "L1.json"
    path.write_text(json.dumps(record | {field: value}))
    try:
        Study.load(root)
    except StudyRecordError as error:
        assert str(path) in str(error)
        assert f"field {field}" in str(error) or "field (document)" in str(error), str(error)
    else:  # only a value of the right shape may pass
        if field in ("length", "threshold", "xor_folds", "k"):
            assert type(value) is int
        elif field == "pairs":
            assert value is None or type(value) is int
        else:
            assert field == "sites" and value == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pairs": 3}, r"L1\.json: .*below k = 10"),
        ({"score_edges": [0.8]}, r"L1\.json: .*one more entry"),
        ({"linkage_id": "L2"}, r"L1\.json: field linkage_id: 'L2', expected 'L1'"),
    ],
)
def test_a_record_the_writer_would_refuse_stops_the_study_naming_the_file(
    tmp_path, change, message
):
    root = study_with(tmp_path)
    (root / "linkages" / "L1.json").write_text(json.dumps(linkage_record() | change))
    with pytest.raises(StudyRecordError, match=message):
        Study.load(root)


def test_bytes_that_are_not_a_record_are_named(tmp_path):
    root = study_with(tmp_path)
    (root / "linkages" / "L1.json").write_bytes(b"\xff not json")
    with pytest.raises(StudyRecordError, match=r"L1\.json: "):
        Study.load(root)


# --- the demo study's report, HTML and PDF --------------------------------------------------------


def test_the_demo_study_with_a_linkage_shows_it_in_the_pdf(study_copy, tmp_path):
    """The demo study's report with one linkage added: its PDF text (pdftotext) holds the
    section, "< 10" for the suppressed bin and "withheld" for the bin that would give it."""
    record = linkage_record(score_counts=[None, 310, 1200, 2880, 535])  # 5 pairs suppressed
    write_linkages(study_copy, record)
    report = build_report(Study.load(study_copy))
    assert "No record linkage is recorded" not in render_html(report)
    pdf = write_pdf(report, tmp_path / "report.pdf")
    pages = subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True, text=True
    ).stdout
    start = pages.index("Record linkage")
    words = " ".join(pages[start : pages.index("7. Harmonisation provenance", start)].split())
    assert "Linkage L1" in words
    assert "given name 2 200 for the field no" in words
    assert "postal code 1 150 for the field yes" in words
    assert "registry registry (holds the outcome) 5,000 4,930 0" in words
    assert "0.55 0.65 < 10" in words and "0.85 0.95 withheld" in words
    assert "0.65 0.75 310" in words and "2,880" not in words
    assert "heuristics, not guarantees" in words
