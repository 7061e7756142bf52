"""The report's record-linkage section (:class:`~reports.model.LinkageSummary`) from its records.

Every value is copied from the linkage record the linkage unit wrote
(``linkages/<id>.json``, :class:`studyfiles.linkage_records.LinkageRecord`): what
each site encoded (identifier fields, n-gram sizes, bit insertions, positional: never
a value), the encoding's length, hashing and XOR folds (Schnell, Bachteler and Reiher
2011; Schnell, Borgs and Encarnação 2016), the threshold, the blocking and what it
shows the linkage unit, where the sites' shared secret came from, and the counts.

Suppression. The writer records counts from 1 to k - 1 as ``None``; the report prints
them as ``< k``. A suppressed count must not follow from the others by subtraction
(primary and complementary suppression, Hundepool et al. 2012, *Statistical
Disclosure Control*, ch. 5), so:

- score histogram: with the number of pairs ``P`` printed, the suppressed bins sum to
  ``P`` minus the printed bins. The largest printed bins are withheld too until, for
  a reader who knows this rule (each withheld bin is at least ``m``, the larger of k
  and every bin still printed), every value 1..k-1 of every suppressed bin remains
  possible: ``hidden >= (k - 1) + (n - 1) + w * m`` for n suppressed and w withheld
  bins, ``hidden`` the pairs not printed in a bin. If no choice of bins meets it,
  no bin is printed;
- per site: records sent minus linked (records not linked) and, when never-compared is
  printed, sent minus linked minus never compared (compared, not linked) are counts
  too; where one falls in 1..k-1, the count that would reveal it is withheld.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from reports.model import LinkageField, LinkageSite, LinkageSummary, ScoreBin
from reports.plots import score_histogram
from studyfiles.linkage_records import LinkageRecord, LinkageSiteRecord

IDENTIFIER_WORDS = {
    "given_name": "given name",
    "family_name": "family name",
    "birth_date": "birth date",
    "sex": "sex",
    "postal_code": "postal code",
}
ROLE_WORDS = {
    "outcome": "registry (holds the outcome)",
    "covariates": "hospital (holds covariates)",
    "party": "party",
}
HASHING = {
    "blakeHash": "keyed BLAKE2b (clkhash blakeHash): each n-gram's bit positions are slices "
    "of one keyed hash",
    "doubleHash": "double hashing (Schnell, Bachteler and Reiher 2011; clkhash doubleHash)",
}
HASH_ALIASES = {"blake": "blakeHash", "double": "doubleHash"}
DOUBLE_HASH_WARNING = (
    "double hashing admits few bit patterns per n-gram and was broken by Kroll and "
    "Steinmetzer (2015, HEALTHINF); the package's default is BLAKE2b"
)
REVEALS = {
    "keys": (
        "each site also sent a keyed hash of each blocking key's value per record, so the "
        "linkage unit sees which of a site's records share a key value: the size of every "
        "key value's group at each site (a frequency table of the key, without its values)"
    ),
    "bits": (
        "blocks are formed from bit positions of the encodings themselves, so blocking shows "
        "the linkage unit nothing it does not already hold; a true pair may be missed"
    ),
    "none": "every record of one site was compared with every record of the other",
}
PROTECTS = (
    "The encodings keep names, birth dates, sex and postal codes out of the linkage unit's "
    "reach as clear text, but they are not encryption: frequency and pattern-mining attacks "
    "on Bloom filters (Christen et al. 2017, 2018) can re-identify frequent values, keyed "
    "blocking shows group sizes, and a site colluding with the linkage unit holds the shared "
    "secret and can encode guesses to test them; these protections are heuristics, not "
    'guarantees (README, "Record linkage").'
)


def linkage_summary(record: LinkageRecord) -> LinkageSummary:
    """The report's view of one recorded linkage."""
    k = record.k
    bins, note = _histogram(record.score_edges, record.score_counts, record.pairs, k)
    hash_type = HASH_ALIASES.get(record.hash_type, record.hash_type)
    plot = None
    if any(b.state == "shown" for b in bins):
        drawn = [(b.low, b.high, _printed_count(b)) for b in bins]
        plot = score_histogram(drawn, k)
    method = str(record.blocking.get("method", ""))
    return LinkageSummary(
        linkage_id=record.linkage_id,
        created=record.created,
        schema_fingerprint=record.schema_fingerprint,
        fields=tuple(_field(f) for f in record.fields),
        length=record.length,
        hashing=HASHING.get(hash_type, hash_type),
        hashing_warning=DOUBLE_HASH_WARNING if hash_type == "doubleHash" else None,
        xor_folds=_folds(record.xor_folds),
        threshold=record.threshold,
        blocking=_blocking(record.blocking),
        blocking_reveals=REVEALS.get(method, "not recorded"),
        secret=record.secret,
        sites=tuple(_site(s, k) for s in record.sites),
        pairs=_count(record.pairs, k),
        candidate_pairs=f"{record.candidate_pairs:,}",
        k=k,
        bins=bins,
        histogram_note=note,
        plot=plot,
        protects=PROTECTS,
    )


def _printed_count(score_bin: ScoreBin) -> int | None:
    return int(score_bin.count.replace(",", "")) if score_bin.state == "shown" else None


def _count(value: int | None, k: int) -> str:
    return f"< {k}" if value is None else f"{value:,}"


def _histogram(
    edges: Sequence[float], counts: Sequence[int | None], pairs: int | None, k: int
) -> tuple[tuple[ScoreBin, ...], str]:
    """The bins to print and a note on what is hidden (module docstring: the rule)."""
    suppressed = [i for i, c in enumerate(counts) if c is None]
    printed = {i: c for i, c in enumerate(counts) if c is not None}
    withheld: set[int] = set()
    if suppressed and pairs is not None:
        while True:
            remaining = [c for i, c in printed.items() if i not in withheld]
            hidden = pairs - sum(remaining)
            floor = max([k, *remaining])
            if withheld and hidden >= (k - 1) + (len(suppressed) - 1) + len(withheld) * floor:
                break
            candidates = [i for i, c in printed.items() if i not in withheld and c > 0]
            if not candidates:
                return (), (
                    f"Not shown: with {pairs:,} linked pairs, any score histogram would let a "
                    f"reader work out a count of fewer than {k} pairs."
                )
            withheld.add(max(candidates, key=lambda i: (printed[i], i)))
    bins = []
    for i, (low, high) in enumerate(pairwise(edges)):
        if i in withheld:
            bins.append(ScoreBin(low, high, "withheld", "withheld"))
        elif counts[i] is None:
            bins.append(ScoreBin(low, high, f"< {k}", "suppressed"))
        else:
            bins.append(ScoreBin(low, high, f"{counts[i]:,}", "shown"))
    note = ""
    if withheld:
        note = (
            f"The score bins marked withheld hold at least {k} pairs each and are not shown, "
            "so that no suppressed bin follows from the number of pairs by subtraction."
        )
    return tuple(bins), note


def _site(site: LinkageSiteRecord, k: int) -> LinkageSite:
    sent, linked, never = site.records_sent, site.linked, site.never_compared
    sent_text, never_text = _count(sent, k), _count(never, k)
    if sent is not None and linked is not None and 0 < sent - linked < k:
        sent_text = f"withheld: fewer than {k} of its records are not linked"
    elif (
        sent is not None
        and linked is not None
        and never is not None
        and 0 < sent - linked - never < k
    ):
        never_text = f"withheld: fewer than {k} of its records were compared and not linked"
    return LinkageSite(
        site=site.site,
        role=ROLE_WORDS.get(site.role, site.role),
        records_sent=sent_text,
        linked=_count(linked, k),
        never_compared=never_text,
    )


def _field(field: Mapping[str, Any]) -> LinkageField:
    name = str(field.get("name", "not recorded"))
    ngram = field.get("ngram")
    if "bits_per_token" in field:
        bits = f"{field['bits_per_token']} per n-gram"
    elif "bits" in field:
        bits = f"{field['bits']} " + ("per n-gram" if field.get("per_token") else "for the field")
    else:
        bits = "not recorded"
    positional = field.get("positional")
    return LinkageField(
        field=IDENTIFIER_WORDS.get(name, name.replace("_", " ")),
        ngram="not recorded" if ngram is None else str(ngram),
        bits=bits,
        positional=("yes" if positional else "no")
        if isinstance(positional, bool)
        else "not recorded",
    )


def _folds(folds: int) -> str:
    if folds == 0:
        return (
            "none: an n-gram sets the same bit positions in every record, which the "
            "pattern-mining attacks need"
        )
    return (
        f"{folds}: each encoding was made {2**folds} times longer and folded onto itself by "
        "XOR (Schnell, Borgs and Encarnação 2016)"
    )


def _blocking(blocking: Mapping[str, Any]) -> str:
    method = blocking.get("method")
    if method == "none":
        return "none: every pair of records was compared"
    if method == "bits":
        return (
            "on the encodings' bits (anonlink bit blocking): "
            f"{blocking.get('tables', 'an unrecorded number of')} tables of "
            f"{blocking.get('bits', 'an unrecorded number of')} bit positions each; two "
            "records are compared when they agree on every position of one table"
        )
    if method == "keys":
        keys = [_key(key) for key in blocking.get("keys") or ()]
        listed = ", ".join(keys) if keys else "keys not recorded"
        return (
            f"on keyed hashes (HMAC-SHA256) of {listed}; two records are compared when they "
            "share the hash of any key"
        )
    return f"{method} (not a method this report knows)"


def _key(key: Any) -> str:
    """``birth date (first 4 characters)`` from ``{"field", "first"}`` or ``[field, first]``."""
    if isinstance(key, Mapping):
        field, first = key.get("field"), key.get("first", 0)
    elif isinstance(key, list | tuple) and len(key) == 2:
        field, first = key
    else:
        return str(key)
    words = IDENTIFIER_WORDS.get(str(field), str(field).replace("_", " "))
    return f"{words} (first {first} characters)" if first else f"{words} (whole value)"
