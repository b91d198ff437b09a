"""Answer-level review: marks with versions and an append-only audit trail, the
derived-label rules, agreement on answers, the answer queue's orderings, and the export
that follows the rules."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.review import (
    LABEL_RULES,
    ORDERINGS,
    STRATA,
    AnswerBook,
    Flag,
    ReviewBook,
    ReviewConflict,
    ScanVerdict,
    answer_agreement,
    label_counts,
    order_answers,
    reviewed_examples,
)
from core.storage import ScannedAnswer, Store

RESPONSE = "The bridge was built in 1820 by Ada Lovell from red granite."


def _example(i: int, response: str = RESPONSE) -> RAGExample:
    return RAGExample(
        id=f"ex{i}",
        question="Who built the bridge?",
        passages=("The bridge was built in 1820 by Ada Lovell.",),
        response=response,
    )


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "r.sqlite3") as s:
        yield s


def test_a_mark_is_versioned_audited_and_refused_when_stale_or_malformed(store: Store):
    answers = AnswerBook(store)
    ex = _example(0)
    first = answers.mark("demo", ex, " ann ", "hallucinated", drawn_by="random", note=" made up ")
    assert (first.reviewer, first.label, first.version, first.note) == (
        "ann",
        "hallucinated",
        1,
        "made up",
    )
    second = answers.mark("demo", ex, "ann", "faithful", drawn_by="random", expected_version=1)
    assert second.version == 2 and second.label == "faithful"
    with pytest.raises(ReviewConflict, match="version 2"):
        answers.mark("demo", ex, "ann", "hallucinated", drawn_by="random", expected_version=1)
    for bad in (
        {"label": "maybe", "drawn_by": "random"},
        {"label": "faithful", "drawn_by": "by hand"},
    ):
        with pytest.raises(DataError):
            answers.mark("demo", ex, "ann", bad["label"], drawn_by=bad["drawn_by"])
    with pytest.raises(DataError, match="reviewer"):
        answers.mark("demo", ex, "  ", "faithful", drawn_by="random")
    assert [m.label for m in answers.marks("demo")] == ["faithful"]  # nothing else written
    trail = answers.audit("demo", "ex0")
    assert [(a.action, a.after["label"]) for a in trail] == [
        ("create", "hallucinated"),
        ("update", "faithful"),
    ]
    assert trail[1].before is not None and trail[1].before["label"] == "hallucinated"
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._conn.execute("DELETE FROM answer_review_audit")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._conn.execute("UPDATE answer_review_audit SET reviewer = 'eve'")


def _flagged(book: ReviewBook, examples: list[RAGExample]) -> None:
    """Two flagged spans on each answer: 'Ada Lovell' and 'red granite'."""
    book.add_flags(
        "demo",
        examples,
        [
            Flag(example_id=e.id, start=s, end=t, sources={"cortex": (0.9, 0.5)})
            for e in examples
            for s, t in ((32, 42), (48, 59))
        ],
    )


def test_every_rule_derives_its_label(store: Store):
    book, answers = ReviewBook(store), AnswerBook(store)
    examples = [_example(i) for i in range(7)]
    _flagged(book, examples)
    items = {(i.example_id, i.start): i.id for i in book.items("demo")}
    # ex0: an answer mark alone
    answers.mark("demo", examples[0], "ann", "faithful", drawn_by="random")
    # ex1: an accepted span, no mark -> hallucinated
    book.save_review(items[("ex1", 32)], "ann", "accept")
    # ex2: every flagged span rejected -> faithful; ex3: only one of two rejected -> no label
    book.save_review(items[("ex2", 32)], "ann", "reject")
    book.save_review(items[("ex2", 48)], "ann", "reject")
    book.save_review(items[("ex3", 32)], "ann", "reject")
    # ex4: the answer mark wins over the same reviewer's accepted span
    book.save_review(items[("ex4", 32)], "ann", "accept")
    answers.mark("demo", examples[4], "ann", "faithful", drawn_by="uncertainty")
    # ex5: a tie between two reviewers -> disputed; ex6 nobody reviewed
    answers.mark("demo", examples[5], "ann", "faithful", drawn_by="random")
    answers.mark("demo", examples[5], "bob", "hallucinated", drawn_by="random")
    labels = answers.labels("demo", examples, book.items("demo"))
    got = {k: (v.status, v.label) for k, v in labels.items()}
    assert got == {
        "ex0": ("faithful", False),
        "ex1": ("hallucinated", True),
        "ex2": ("faithful", False),
        "ex3": ("unreviewed", None),
        "ex4": ("faithful", False),
        "ex5": ("disputed", None),
        "ex6": ("unreviewed", None),
    }
    assert labels["ex1"].rule == "1 of 1 reviewers (accepted span)"
    assert labels["ex2"].reviewers[0].source == "every span rejected"
    # only marks made in the random order may calibrate
    assert [k for k, v in labels.items() if v.random] == ["ex0", "ex5"]
    assert label_counts(labels.values(), random_only=True) == {
        "faithful": 1,
        "hallucinated": 0,
        "disputed": 0,
        "unreviewed": 0,
    }
    # a third reviewer breaks the tie (strict majority)
    answers.mark("demo", examples[5], "cy", "hallucinated", drawn_by="stratified")
    assert answers.labels("demo", examples, book.items("demo"))["ex5"].status == "hallucinated"
    assert len(LABEL_RULES) == 5


def test_a_mark_on_another_version_of_the_answer_counts_for_nothing(store: Store):
    answers = AnswerBook(store)
    ex = _example(0)
    answers.mark("demo", ex, "ann", "hallucinated", drawn_by="random")
    changed = dataclasses.replace(ex, response=RESPONSE.replace("red", "tan"))
    assert answers.labels("demo", [changed], [])["ex0"].status == "unreviewed"
    assert reviewed_examples([changed], [], marks=answers.marks("demo")) == []


def test_the_export_follows_the_rules_with_marks_spans_and_a_reviewer(store: Store):
    book, answers = ReviewBook(store), AnswerBook(store)
    examples = [_example(i) for i in range(4)]
    _flagged(book, examples)
    items = {(i.example_id, i.start): i.id for i in book.items("demo")}
    book.save_review(items[("ex0", 32)], "ann", "accept", kind="conflict")
    answers.mark("demo", examples[1], "ann", "hallucinated", drawn_by="random")  # no span
    answers.mark("demo", examples[2], "ann", "faithful", drawn_by="random")
    answers.mark("demo", examples[2], "bob", "hallucinated", drawn_by="random")  # disputed
    marks = answers.marks("demo")
    out = reviewed_examples(examples, book.items("demo"), marks=marks)
    assert [(e.id, e.label, [(s.start, s.end) for s in e.spans]) for e in out] == [
        ("ex0", True, [(32, 42)]),
        ("ex1", True, []),
    ]
    kept = reviewed_examples(examples, book.items("demo"), marks=marks, include_unreviewed=True)
    assert [e.id for e in kept] == ["ex0", "ex1", "ex2", "ex3"] and kept[2] == examples[2]
    bobs = reviewed_examples(examples, book.items("demo"), marks=marks, reviewer="bob")
    assert [(e.id, e.label) for e in bobs] == [("ex2", True)]


def test_answer_agreement_is_cohens_kappa_over_answers_both_labelled(store: Store):
    answers = AnswerBook(store)
    examples = [_example(i) for i in range(10)]
    a = ["hallucinated"] * 6 + ["faithful"] * 4
    b = ["hallucinated"] * 4 + ["faithful"] * 2 + ["hallucinated"] + ["faithful"] * 3
    for ex, la, lb in zip(examples, a, b, strict=True):
        answers.mark("demo", ex, "ann", la, drawn_by="random")
        answers.mark("demo", ex, "bob", lb, drawn_by="random")
    got = answer_agreement(answers.labels("demo", examples, []).values())
    assert got is not None and got.reviewers == ("ann", "bob") and got.n_answers == 10
    assert got.kappa == pytest.approx(0.4) and got.agree == pytest.approx(0.7)
    assert answer_agreement(answers.labels("other", examples, []).values()) is None


def _scanned(probs: dict[str, float], threshold: float = 0.5) -> dict[str, ScannedAnswer]:
    return {
        k: ScannedAnswer(
            dataset="d",
            example_id=k,
            example_hash="h",
            probability=p,
            threshold=threshold,
            judged_by="set default",
            scanned_at="now",
        )
        for k, p in probs.items()
    }


def test_the_random_order_is_fixed_per_dataset_and_a_permutation():
    ids = [f"a{i}" for i in range(50)]
    one = order_answers(ids, "random", dataset="dolly")
    assert sorted(one) == sorted(ids) and one != ids
    assert order_answers(ids, "random", dataset="dolly") == one  # every session, every reviewer
    assert order_answers(ids, "random", dataset="finqa") != one
    with pytest.raises(DataError, match="one of"):
        order_answers(ids, "alphabetical", dataset="dolly")
    with pytest.raises(DataError, match="same id"):
        order_answers(["a", "a"], "random", dataset="dolly")
    assert set(ORDERINGS) == {"random", "uncertainty", "stratified"}


def test_uncertainty_puts_the_answers_nearest_the_threshold_first_then_the_unscanned():
    ids = ["far", "near", "mid", "unscanned1", "unscanned2"]
    scanned = _scanned({"far": 0.99, "near": 0.52, "mid": 0.3})
    got = order_answers(ids, "uncertainty", dataset="d", scanned=scanned)
    assert got[:3] == ["near", "mid", "far"]
    assert sorted(got[3:]) == ["unscanned1", "unscanned2"]


def test_stratified_covers_the_score_range_in_every_prefix():
    rng = np.random.default_rng(0)
    probs = {f"a{i}": float(p) for i, p in enumerate(rng.random(100))}
    got = order_answers(list(probs), "stratified", dataset="d", scanned=_scanned(probs))
    assert sorted(got) == sorted(probs)
    first = [probs[k] for k in got[:STRATA]]  # one answer from each fifth of the scores
    edges = np.quantile(list(probs.values()), np.linspace(0, 1, STRATA + 1))
    bins = sorted(int(np.searchsorted(edges[1:-1], p, side="right")) for p in first)
    assert bins == list(range(STRATA))


def test_a_scan_keeps_the_sets_verdicts_and_refuses_impossible_ones(store: Store):
    answers = AnswerBook(store)
    examples = [_example(0), _example(1)]
    n = answers.record_scan(
        "demo",
        examples,
        {"ex0": ScanVerdict(probability=0.7, threshold=0.4, judged_by="set default, ensemble")},
    )
    assert n == 1
    got = answers.scanned("demo", examples)
    assert got["ex0"].probability == pytest.approx(0.7) and got["ex0"].margin == pytest.approx(0.3)
    for bad in (float("nan"), 1.5, -0.1):
        with pytest.raises(DataError, match="ex1"):
            answers.record_scan(
                "demo",
                examples,
                {"ex1": ScanVerdict(probability=bad, threshold=0.5, judged_by="x")},
            )
    with pytest.raises(DataError, match="not an answer"):
        answers.record_scan(
            "demo", examples, {"zz": ScanVerdict(probability=0.5, threshold=0.5, judged_by="x")}
        )
    assert list(answers.scanned("demo", examples)) == ["ex0"]  # nothing else written
    changed = [dataclasses.replace(examples[0], response="Another answer."), examples[1]]
    assert answers.scanned("demo", changed) == {}  # a re-imported answer is scanned again


def test_a_version_8_database_keeps_its_jobs_and_takes_adaptation_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core import storage
    from core.storage import db as storage_db

    db = tmp_path / "old.sqlite3"
    with monkeypatch.context() as m:
        m.setattr(storage_db, "MIGRATIONS", storage.MIGRATIONS[:8])
        m.setattr(storage_db, "SCHEMA_VERSION", 8)
        with Store(db) as s:
            old = s.create_job(kind="train", model="m", spec={"a": 1}, out="/o", owner="ann")
            s.finish_job(old, "done", result={"ok": True})
            with pytest.raises(DataError):
                s.create_job(kind="adapt", model="m2", spec={}, out="/o")
            with pytest.raises(sqlite3.IntegrityError):
                s._conn.execute(
                    "INSERT INTO jobs (kind, model, spec, out, status, created_at) "
                    "VALUES ('adapt', 'm', '{}', '/o', 'done', 'now')"
                )
    with Store(db) as s:
        assert s.schema_version() == len(storage.MIGRATIONS) >= 9
        row = s.get_job(old)
        assert (row.kind, row.status, row.owner, row.result) == (
            "train",
            "done",
            "ann",
            {"ok": True},
        )
        new = s.create_job(kind="adapt", model="m", spec={"b": 2}, out="/a")
        assert s.latest_job("m", kind="adapt").id == new
        assert s.latest_job("m", kind="train").id == old
        with pytest.raises(storage.JobBusyError):  # one active job per model, of any kind
            s.create_job(kind="train", model="m", spec={}, out="/o")


def test_a_note_over_the_limit_is_refused_and_nothing_is_written(store: Store):
    from core.review.book import MAX_NOTE

    answers, book = AnswerBook(store), ReviewBook(store)
    ex = _example(0)
    with pytest.raises(DataError, match="at most"):
        answers.mark("demo", ex, "ann", "faithful", drawn_by="random", note="x" * (MAX_NOTE + 1))
    assert answers.marks("demo") == []
    _flagged(book, [ex])
    item = book.items("demo")[0]
    with pytest.raises(DataError, match="at most"):
        book.save_review(item.id, "ann", "accept", note="y" * (MAX_NOTE + 1))
    assert book.item(item.id).reviews == ()
    ok = answers.mark("demo", ex, "ann", "faithful", drawn_by="random", note="z" * MAX_NOTE)
    assert ok.note is not None and len(ok.note) == MAX_NOTE
