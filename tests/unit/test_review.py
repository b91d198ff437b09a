"""Annotation review: flags from token scores, the queue, decisions with an append-only
audit trail, concurrent writers, inter-annotator agreement, export -> import."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import sqlite3
import threading
import unicodedata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.base.errors import DataError, StorageError
from core.data import load_dataset, resolve_dataset
from core.learning.contract import Verdict
from core.review import (
    Flag,
    ReviewBook,
    ReviewConflict,
    ScannedAnswer,
    agreement,
    judged_set,
    propose_flags,
    reviewed_examples,
    reviews_frame,
    scan_flags,
    scanned_with_another_set,
    write_ragtruth_jsonl,
)
from core.storage import Store

RESPONSE = "The bridge was built in 1820 by Ada Lovell from red granite."


def _example(i: int = 0, **kw):
    from core.base.examples import RAGExample

    return RAGExample(
        id=f"ex{i}",
        question="Who built the bridge?",
        passages=("The bridge was built in 1820 by Ada Lovell.",),
        response=RESPONSE,
        label=True,
        **kw,
    )


def _offsets(text: str) -> np.ndarray:
    out, pos = [], 0
    for w in text.split(" "):
        out.append((pos, pos + len(w)))
        pos += len(w) + 1
    return np.asarray(out)


def _verdict(name: str, scores: list[float]) -> Verdict:
    offs = _offsets(RESPONSE)
    assert len(scores) == len(offs)
    return Verdict(
        detector=name,
        example_id="ex0",
        score=0.5,
        token_scores=np.asarray(scores, np.float32),
        token_offsets=offs,
    )


@pytest.fixture
def book(tmp_path: Path):
    with Store(tmp_path / "r.sqlite3") as s:
        yield ReviewBook(s)


def _queue(book: ReviewBook, n: int = 3):
    examples = [_example(i) for i in range(n)]
    flags = [
        Flag(example_id=e.id, start=52, end=60, sources={"cortex": (0.9, 0.5)}) for e in examples
    ]
    flags.append(Flag(example_id="ex0", start=0, end=3, sources={"nll": (0.55, 0.5)}))
    book.add_flags("demo", examples, flags)
    return examples


# --------------------------------------------------------------------------- flags


def test_flags_are_runs_over_threshold_merged_across_detectors():
    #        The  bridge was  built in  1820 by  Ada  Lovell from red  granite.
    a = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.8, 0.9]
    b = [0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.7, 0.7, 0.1]
    ex = _example()
    flags = propose_flags(ex, {"a": _verdict("a", a), "b": _verdict("b", b)}, {"a": 0.5, "b": 0.6})
    assert [(f.start, f.end) for f in flags] == [(0, 3), (43, 60)]
    assert RESPONSE[43:60] == "from red granite."
    merged = flags[1]
    assert merged.sources == {"a": (pytest.approx(0.9), 0.5), "b": (pytest.approx(0.7), 0.6)}
    assert merged.score == pytest.approx(0.9)
    assert merged.margin == pytest.approx(0.1)  # b: 0.7 - 0.6
    assert flags[0].sources == {"b": (pytest.approx(0.9), 0.6)}
    # only the detectors given thresholds count
    assert [f.start for f in propose_flags(ex, {"a": _verdict("a", a)}, {"a": 0.95})] == []
    # runs one token apart are one span (core.pipeline.word_spans.GAP_TOKENS); three apart are two,
    # unless smoothing joins them
    one_gap = propose_flags(ex, {"a": _verdict("a", [0.1] * 8 + [0.9, 0.4, 0.9, 0.9])}, {"a": 0.5})
    assert [RESPONSE[f.start : f.end] for f in one_gap] == ["Lovell from red granite."]
    gap = [0.9, 0.4, 0.4, 0.4, 0.9] + [0.1] * 7
    raw = propose_flags(ex, {"a": _verdict("a", gap)}, {"a": 0.5})
    assert [RESPONSE[f.start : f.end] for f in raw] == ["The", "in"]
    smooth = propose_flags(ex, {"a": _verdict("a", gap)}, {"a": 0.5}, p_stay=0.9)
    assert [RESPONSE[f.start : f.end] for f in smooth] == ["The bridge was built in"]


def test_flags_are_whole_words_never_punctuation_alone():
    from core.base.examples import RAGExample

    text = "The Haggle run ended ."
    ex = RAGExample(id="h", question="Q?", passages=("P.",), response=text, label=True)
    offsets = np.asarray([(0, 3), (3, 5), (5, 10), (10, 14), (14, 20), (20, 22)])
    #                      The    " H"    aggle    " run"   " ended"  " ."
    scores = np.asarray([0.1, 0.1, 0.9, 0.8, 0.1, 0.1])
    v = Verdict(detector="a", example_id="h", score=0.5, token_scores=scores, token_offsets=offsets)
    flags = propose_flags(ex, {"a": v}, {"a": 0.5})
    assert [text[f.start : f.end] for f in flags] == ["Haggle run"]
    assert flags[0].sources == {"a": (pytest.approx(0.9), 0.5)}
    stop = dataclasses.replace(v, token_scores=np.asarray([0.1] * 5 + [0.9]))
    assert propose_flags(ex, {"a": stop}, {"a": 0.5}) == []  # a full stop alone


def test_a_scan_says_why_a_detector_flags_nothing():
    exs = [_example(0), _example(1)]
    low = [0.1] * 10 + [0.3, 0.2]
    high = [0.1] * 10 + [0.8, 0.9]
    verdicts = {
        "ex0": {"a": _verdict("a", low), "b": Verdict(detector="b", example_id="ex0", score=0.9)},
        "ex1": {"a": _verdict("a", high), "b": Verdict(detector="b", example_id="ex1", score=0.2)},
    }
    scan = scan_flags(exs, verdicts, {"a": 0.95, "b": 0.5})
    assert scan.flags == () and scan.n_answers == 2
    assert [(d.detector, d.n_scored, d.top, d.n_spans) for d in scan.detectors] == [
        ("a", 2, pytest.approx(0.9), 0),
        ("b", 0, None, 0),
    ]
    text = scan.summary(new=0, unread=1)
    assert text.startswith("Scanned 2 answers: 0 flagged spans, 0 new in the queue")
    assert "1 answer could not be read." in text
    assert "No token of these 2 answers reaches a's token threshold 0.950 (highest 0.900)" in text
    assert "b gives no token scores, so no spans." in text
    found = scan_flags(exs, verdicts, {"a": 0.5})
    assert [(f.example_id, RESPONSE[f.start : f.end]) for f in found.flags] == [
        ("ex1", "red granite.")
    ]
    assert found.summary(new=1) == (
        "Scanned 2 answers: 1 flagged span, 1 new in the queue (0 were there already)."
    )
    # smoothed, one lone high token falls under the threshold: the note reads the
    # smoothed scores the flags were drawn from
    lone = {"ex0": {"a": _verdict("a", [0.1] * 5 + [0.9] + [0.1] * 6)}}
    assert len(scan_flags(exs[:1], lone, {"a": 0.5}).flags) == 1
    smoothed = scan_flags(exs[:1], lone, {"a": 0.5}, p_stay=0.9)
    assert smoothed.flags == () and smoothed.detectors[0].top < 0.5
    assert "reaches a's token threshold 0.500" in smoothed.summary(new=0)
    # one answer is one answer; a rescan says so, with the set that judged it
    one = scan_flags(exs[:1], {"ex0": {"a": _verdict("a", low)}}, {"a": 0.95})
    assert "No token of this answer reaches a's token threshold" in one.summary(new=0)
    assert one.summary(new=0, again="default").startswith(
        "Scanned again 1 answer with the default set (its verdict replaces the earlier "
        "scan's): 0 flagged spans"
    )


def test_a_scanned_verdict_names_its_set_and_tells_a_previous_one() -> None:
    def scanned(judged_by: str) -> ScannedAnswer:
        return ScannedAnswer(
            dataset="d", example_id="e", example_hash="h", probability=0.7, threshold=0.5,
            judged_by=judged_by, scanned_at="2026-01-01T00:00:00+00:00",
        )  # fmt: skip

    deferred = scanned("set ragtruth (used by default here), ensemble, calibrated for x")
    adapted = scanned("set default+mine-1a2b3c4d, ensemble, pooled calibration")
    assert judged_set(deferred) == "ragtruth"
    assert judged_set(adapted) == "default+mine-1a2b3c4d"
    assert judged_set(scanned("an older record")) is None
    assert scanned_with_another_set(deferred, "ragtruth") is None  # the expert judges it now
    assert scanned_with_another_set(adapted, "default") == "default+mine-1a2b3c4d"
    assert scanned_with_another_set(scanned("an older record"), "default") is None


# --------------------------------------------------------------------------- queue


def test_queue_is_idempotent_and_filters_and_sorts(book: ReviewBook):
    examples = _queue(book)
    assert _queue(book) == examples  # the same flags again: nothing new
    items = book.items("demo", sort="position")
    assert len(items) == 4 and [i.status for i in items] == ["open"] * 4
    assert [i.example_id for i in book.items("demo", detectors=["nll"])] == ["ex0"]
    assert book.items("demo", sort="uncertainty")[0].detectors == ("nll",)  # margin 0.05
    assert book.items("demo", sort="score")[0].score == pytest.approx(0.9)
    assert book.items("demo", tasks=["summary"]) == []
    assert book.datasets() == [("demo", 4)]
    with pytest.raises(DataError, match="outside the answer of 'ex1'"):
        book.add_flags("demo", examples, [Flag(example_id="ex1", start=0, end=999, sources={})])
    with pytest.raises(DataError, match="unknown example 'nope'"):
        book.add_flags("demo", examples, [Flag(example_id="nope", start=0, end=1, sources={})])
    assert len(book.items("demo")) == 4


def test_reviews_update_with_versions_and_an_append_only_audit(book: ReviewBook):
    _queue(book)
    item = book.items("demo", sort="position")[0]
    r1 = book.save_review(item.id, "ann", "accept", kind="baseless", evidence="evident")
    assert (r1.version, r1.start, r1.end, r1.label_type) == (1, 52, 60, "Evident Baseless Info")
    r2 = book.save_review(item.id, "ann", "accept", start=56, end=60, note="only granite",
                          expected_version=1)  # fmt: skip
    assert (r2.version, r2.start, r2.note, r2.kind) == (2, 56, "only granite", None)
    # a save based on version 1 again (a second tab) is refused; nothing is lost
    with pytest.raises(ReviewConflict, match="reload") as info:
        book.save_review(item.id, "ann", "reject", expected_version=1)
    assert info.value.attempted["decision"] == "reject"
    assert book.item(item.id).review_by("ann").version == 2
    # bad input names the record and changes nothing
    n_audit = len(book.audit())
    with pytest.raises(DataError, match="'ex0'"):
        book.save_review(item.id, "ann", "accept", start=50, end=999)
    with pytest.raises(DataError, match="reviewer"):
        book.save_review(item.id, "  ", "accept")
    with pytest.raises(DataError, match="kind"):
        book.save_review(item.id, "ann", "accept", kind="made-up")
    with pytest.raises(StorageError, match="no review item"):
        book.save_review(10**6, "ann", "accept")
    assert len(book.audit()) == n_audit
    trail = book.audit(item.id)
    assert [a.action for a in trail] == ["create", "update"]
    assert trail[1].before["start"] == 52 and trail[1].after["start"] == 56
    assert trail[1].reviewer == "ann" and trail[1].at >= trail[0].at
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        book.store._query("UPDATE review_audit SET reviewer = 'mallory'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        book.store._query("DELETE FROM review_audit")
    # a second reviewer has their own row; the item is now disputed
    book.save_review(item.id, "bob", "reject")
    assert book.item(item.id).status == "disputed"
    assert book.reviewers("demo") == ["ann", "bob"]
    assert [i.id for i in book.items("demo", statuses=["disputed"])] == [item.id]


def test_two_writers_at_once_lose_nothing(tmp_path: Path):
    db = tmp_path / "shared.sqlite3"
    with Store(db) as s:
        _queue(ReviewBook(s))
        ids = [i.id for i in ReviewBook(s).items("demo", sort="position")]
    n = 25
    errors: list[BaseException] = []

    def work(reviewer: str) -> None:
        try:
            with Store(db) as s:  # its own connection, as a second app process has
                b = ReviewBook(s)
                for k in range(n):
                    item = ids[k % len(ids)]
                    have = b.item(item).review_by(reviewer)
                    b.save_review(
                        item,
                        reviewer,
                        "accept" if k % 2 else "reject",
                        note=f"{reviewer} {k}",
                        expected_version=have.version if have else 0,
                    )
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(name,)) for name in ("ann", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with Store(db) as s:  # and after a restart
        b = ReviewBook(s)
        audit = b.audit()
        assert len(audit) == 2 * n
        for name in ("ann", "bob"):
            mine = [a for a in audit if a.reviewer == name]
            assert len(mine) == n and mine[-1].after["note"] == f"{name} {n - 1}"
            versions = [b.item(i).review_by(name).version for i in ids]
            assert sum(versions) == n  # every save landed on its own row


# --------------------------------------------------------------------------- agreement


def test_kappa_and_span_f1_match_a_hand_computed_case(book: ReviewBook):
    examples = [_example(i) for i in range(10)]
    book.add_flags(
        "k",
        examples,
        [Flag(example_id=e.id, start=52, end=60, sources={"x": (0.9, 0.5)}) for e in examples],
    )
    items = book.items("k", sort="position")
    a = ["accept"] * 6 + ["reject"] * 4
    b = ["accept"] * 4 + ["reject"] * 2 + ["accept"] + ["reject"] * 3
    for it, da, db_ in zip(items, a, b, strict=True):
        book.save_review(it.id, "ann", da)
        book.save_review(it.id, "bob", db_, start=56 if it.example_id == "ex0" else None)
    # p_o = 7/10; p_e = 0.6*0.5 + 0.4*0.5 = 0.5; kappa = (0.7 - 0.5) / 0.5 = 0.4
    got = agreement(book.items("k"))
    assert got.reviewers == ("ann", "bob") and got.n_items == 10
    assert got.kappa == pytest.approx(0.4)
    # accepted spans: ann on ex0..ex5, bob on ex0..ex3 and ex6 (ex0 narrowed, still overlaps)
    # precision 4/6, recall 4/5 -> F1 = 2 * (2/3) * (4/5) / (2/3 + 4/5) = 8/11
    assert got.span_f1 == pytest.approx(8 / 11)
    assert agreement(book.items("demo-none")) is None


# --------------------------------------------------------------------------- export


def test_export_then_import_gives_back_the_reviewed_dataset(book: ReviewBook, tmp_path: Path):
    examples = _queue(book)
    items = book.items("demo", sort="position")
    book.save_review(items[0].id, "ann", "accept", start=56, kind="conflict", evidence="subtle",
                     note="granite vs basalt")  # fmt: skip
    book.save_review(items[3].id, "ann", "reject")  # ex0's other flag
    book.save_review(items[1].id, "ann", "reject")  # ex1: rejected -> faithful
    reviewed = reviewed_examples(examples, book.items("demo"))
    assert [e.id for e in reviewed] == ["ex0", "ex1"]
    assert reviewed[0].label and reviewed[0].spans[0].type == "Subtle Conflict"
    assert (reviewed[0].spans[0].start, reviewed[0].spans[0].note) == (56, "granite vs basalt")
    assert reviewed[1].label is False and reviewed[1].spans == ()
    path = write_ragtruth_jsonl(reviewed, tmp_path / "reviewed.jsonl")
    back = load_dataset(path).examples
    assert [_plain(e) for e in back] == [_plain(e) for e in reviewed]
    # with every answer kept (unreviewed ones as they were), and RAGTruth's own prompts
    everything = reviewed_examples(examples, book.items("demo"), include_unreviewed=True)
    assert len(everything) == 3 and everything[2] == examples[2]
    ragtruth = [e for e in resolve_dataset("../shared/data/ragtruth_qa_dev.jsonl")[1] if e.spans][
        :5
    ]
    builtin = resolve_dataset("builtin")[1][:5]
    for original in (ragtruth, builtin, everything):
        p = write_ragtruth_jsonl(original, tmp_path / "round.jsonl")
        assert [_plain(e) for e in load_dataset(p).examples] == [_plain(e) for e in original]
    frame = reviews_frame(book.items("demo", sort="position"), examples)
    assert list(frame["decision"].fillna("-")) == ["accept", "reject", "-", "reject"]
    assert (
        frame.loc[0, "text"] == RESPONSE[56:60] and frame.loc[0, "label_type"] == "Subtle Conflict"
    )


def _plain(e):
    """An example without where it was read from (the file and the dataset name differ)."""
    return dataclasses.replace(
        e, provenance=dataclasses.replace(e.provenance, source=None, dataset=None)
    )


def test_a_reviewer_adds_a_span_the_detectors_missed(book: ReviewBook):
    examples = _queue(book)
    ex = examples[1]
    r = book.add_missed_span("demo", ex, "ann", 24, 28, kind="baseless", evidence="evident")
    item = book.item(r.item_id)
    assert (item.start, item.end, item.detectors) == (24, 28, ("added by ann",))
    assert (r.decision, r.reviewer, r.label_type) == ("accept", "ann", "Evident Baseless Info")
    assert RESPONSE[24:28] == "1820"
    again = book.add_missed_span("demo", ex, "ann", 24, 28, note="the year")
    assert again.item_id == r.item_id and again.version == 2 and again.note == "the year"
    n = len(book.items("demo"))
    with pytest.raises(DataError, match="'ex1'"):
        book.add_missed_span("demo", ex, "ann", 50, 500)
    with pytest.raises(DataError, match="reviewer"):
        book.add_missed_span("demo", ex, " ", 0, 3)
    assert len(book.items("demo")) == n
    reviewed = reviewed_examples(examples, book.items("demo"))
    assert any(s.start == 24 and s.end == 28 for e in reviewed if e.id == "ex1" for s in e.spans)


def test_items_of_a_changed_answer_are_stale_and_never_exported(book: ReviewBook, tmp_path):
    examples = _queue(book, 2)
    items = book.items("demo", sort="position")
    first = next(i for i in items if i.example_id == "ex0" and i.start == 52)
    book.save_review(first.id, "ann", "accept", example=examples[0])
    # the dataset is re-imported: ex0's answer changed (same length), ex1 is gone
    changed = dataclasses.replace(examples[0], response=RESPONSE.replace("red", "tan"))
    now = [changed]
    items = book.items("demo", sort="position")
    by_id = {e.id: e for e in now}
    stale = {i.id for i in items if i.is_stale(by_id.get(i.example_id))}
    assert stale == {i.id for i in items}  # every item: changed text, or no answer at all
    assert not next(i for i in items if i.id == first.id).is_stale(examples[0])
    with pytest.raises(DataError, match="stale"):
        book.save_review(first.id, "bob", "reject", example=changed)
    assert book.item(first.id).review_by("bob") is None  # nothing written
    assert reviewed_examples(now, items) == []
    assert reviews_frame(items, now).empty
    write_ragtruth_jsonl(
        reviewed_examples(now, items, include_unreviewed=True), tmp_path / "x.jsonl"
    )
    # a rescan refreshes the unreviewed item for the new text; the reviewed one stays stale
    flags = [
        Flag(example_id="ex0", start=52, end=60, sources={"cortex": (0.8, 0.5)}),
        Flag(example_id="ex0", start=0, end=3, sources={"nll": (0.6, 0.5)}),
    ]
    assert book.add_flags("demo", now, flags) == 0
    items = {(i.start, i.end): i for i in book.items("demo") if i.example_id == "ex0"}
    assert items[(52, 60)].is_stale(changed) and not items[(0, 3)].is_stale(changed)
    assert items[(0, 3)].sources == {"nll": (0.6, 0.5)}


def test_csv_export_neutralises_spreadsheet_formulas(book: ReviewBook):
    import csv
    import io

    from core.review import neutralise_cell, safe_csv

    ex = _example(0)
    evil = dataclasses.replace(ex, id='=HYPERLINK("http://evil.example")')
    book.add_flags(
        "demo", [evil], [Flag(example_id=evil.id, start=0, end=3, sources={"x": (1, 0.5)})]
    )
    item = book.items("demo")[0]
    for note, who in (("+cmd|' /C calc'!A0", "@SUM(1+1)"), ("-2+3", "\tx"), ("\rx", "ok")):
        book.save_review(item.id, who, "accept", note=note)
    text = safe_csv(reviews_frame(book.items("demo"), [evil]))
    cells = [c for row in csv.reader(io.StringIO(text)) for c in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert '\'=HYPERLINK("http://evil.example")' in cells and "'@SUM(1+1)" in cells
    assert neutralise_cell(-3) == -3 and neutralise_cell("plain") == "plain"


def _runs_as_formula(cell: str) -> bool:
    """What a spreadsheet may read as a formula: a tab/CR/LF start, or ``= + - @`` first
    once leading blanks are stripped and the text NFKC-normalised (``＝`` is ``=``)."""
    bare = unicodedata.normalize("NFKC", cell.lstrip()).lstrip()
    return cell[:1] in ("\t", "\r", "\n") or bare[:1] in ("=", "+", "-", "@")


@pytest.mark.parametrize(
    "text",
    [" =1+1", "\n=1+1", "\t=1", "\r@SUM(1)", "＝1+1", "＋cmd", "－2+3", "＠SUM(1)", "﹦1",
     "\u3000=1", "  \n +1", "\u200b=1", "\ufeff-1"],
)  # fmt: skip
def test_csv_export_neutralises_formulas_behind_blanks_and_full_width(text: str) -> None:
    from core.review import formula_like, safe_csv

    assert formula_like(text)
    frame = pd.DataFrame({text: [text, "plain"], "n": [-1.5, 2.0]}, index=[text, "i"])
    for index in (False, True):
        rows = list(csv.reader(io.StringIO(safe_csv(frame, index=index), newline="")))
        cells = [c for row in rows for c in row]
        assert cells.count("'" + text) == (3 if index else 2), rows  # header, cell, index
        assert "-1.5" in cells and "plain" in cells  # numbers and plain text as they were


csv_text = st.one_of(
    st.text(max_size=12),
    st.builds(
        str.__add__,
        st.text(alphabet=" \t\r\n\u3000\u00a0\u200b\ufeff'", max_size=3),
        st.builds(
            str.__add__,
            st.sampled_from(list("=+-@＝＋－＠﹦﹢﹣﹫⁼⁺₌₊a1'")),
            st.text(max_size=8),
        ),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    cols=st.lists(csv_text.filter(lambda c: c != "number"), min_size=1, max_size=4, unique=True),
    cells=st.lists(csv_text, min_size=1, max_size=12),
    nums=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=12),
    index=st.booleans(),
)
def test_no_exported_text_cell_starts_a_formula(
    cols: list[str], cells: list[str], nums: list[float], index: bool
) -> None:
    from core.review import safe_csv

    n = max(len(cells), len(nums))
    frame = pd.DataFrame(
        {c: [cells[(k + j) % len(cells)] for j in range(n)] for k, c in enumerate(cols)}
    )
    frame["number"] = [nums[j % len(nums)] for j in range(n)]
    frame.index = pd.Index([cells[j % len(cells)] for j in range(n)], name=cols[0])
    rows = list(csv.reader(io.StringIO(safe_csv(frame, index=index), newline="")))
    width = len(cols) + 1 + index
    assert len(rows) == n + 1 and all(len(r) == width for r in rows)
    number = rows[0].index("number")
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            if r and c == number:
                assert cell == "" or np.isfinite(float(cell)) or cell in ("inf", "-inf"), cell
            else:
                assert not _runs_as_formula(cell) or cell.startswith("'"), (r, c, cell)


def test_every_csv_export_goes_through_safe_csv() -> None:
    # One helper neutralises formulas: no other CSV writer in core/ or app/.
    root = Path(__file__).resolve().parents[2]
    writers = re.compile(r"\.to_csv\(|csv\.writer\(|csv\.DictWriter\(")
    found = [
        f"{p.relative_to(root)}:{i}"
        for top in ("core", "app")
        for p in sorted((root / top).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if writers.search(line)
    ]
    assert found == [f"core/review/export.py:{_line_of('return out.to_csv(')}"]


def _line_of(text: str) -> int:
    root = Path(__file__).resolve().parents[2]
    lines = (root / "core" / "review" / "export.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_version_3_database_migrates_and_its_items_still_load(tmp_path: Path, monkeypatch):
    from core import storage
    from core.storage import db as storage_db

    db = tmp_path / "old.sqlite3"
    with monkeypatch.context() as m:
        m.setattr(storage_db, "MIGRATIONS", storage.MIGRATIONS[:3])
        m.setattr(storage_db, "SCHEMA_VERSION", 3)
        with Store(db) as s, s._tx() as c:
            c.execute(
                "INSERT INTO review_items (dataset, example_id, span_start, span_end, "
                "answer_len, sources, score, margin, position, created_at) "
                "VALUES ('demo', 'ex0', 0, 3, ?, '{}', 0.9, 0.4, 0, 'then')",
                (len(RESPONSE),),
            )
    with Store(db) as s:
        assert s.schema_version() == len(storage.MIGRATIONS) >= 4
        (item,) = ReviewBook(s).items("demo")
    assert item.example_hash is None
    assert not item.is_stale(_example(0))  # same length: cannot tell, trusted
    assert item.is_stale(_example(0).with_response(RESPONSE + " Also."))


def test_a_type_chosen_without_evidence_is_kept_shown_and_exported(book: ReviewBook):
    """A reviewer who picks the kind (conflict) but no evidence level keeps that choice:
    stored, in words (type_text) and in the table's own kind / evidence columns."""
    examples = _queue(book)
    items = book.items("demo", sort="position")
    book.save_review(items[0].id, "ann", "accept", kind="conflict")
    book.save_review(items[1].id, "ann", "accept", evidence="subtle")
    book.save_review(items[2].id, "ann", "accept", kind="baseless", evidence="evident")
    r0, r1, r2 = (book.item(it.id).reviews[0] for it in items[:3])
    assert (r0.kind, r0.evidence, r0.label_type, r0.type_text) == (
        "conflict",
        None,
        None,
        "conflict",
    )
    assert (r1.kind, r1.evidence, r1.type_text) == (None, "subtle", "subtle")
    assert r2.type_text == r2.label_type == "Evident Baseless Info"
    frame = reviews_frame(book.items("demo", sort="position"), examples)
    rows = frame.set_index("item")
    assert rows.loc[items[0].id, "kind"] == "conflict" and pd.isna(
        rows.loc[items[0].id, "evidence"]
    )
    assert rows.loc[items[1].id, "evidence"] == "subtle"
    assert rows.loc[items[2].id, ["kind", "evidence", "label_type"]].tolist() == [
        "baseless",
        "evident",
        "Evident Baseless Info",
    ]
