"""The Review page's whole-answer mode (AppTest, tiny model, the demo detectors): marks in
the random order before any scan, a scan that keeps the set's verdicts, the uncertainty
order, a second reviewer and the agreement on answers, and the export by the rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from streamlit.testing.v1 import AppTest

from app.state.review import KEY_A_SKIP_MINE
from core.review import AnswerBook, ReviewBook, ScanVerdict, order_answers
from core.storage import Store

PAGE = "views/review.py"
KEY = "corpus"


def _start(at: AppTest, name: str) -> None:
    at.text_input(key="review.name").input(name)
    at.button(key="review.start").click().run()
    assert not at.exception, [e.value for e in at.exception]
    # Review opens on Home's dataset (the quick demo here); these tests review the corpus
    at.selectbox(key="review.dataset").set_value(KEY).run()
    assert not at.exception, [e.value for e in at.exception]


def _chosen(at: AppTest) -> list[str]:
    """The labels whose button is drawn as chosen (filled)."""
    return [
        label
        for label in ("faithful", "hallucinated")
        if at.button(key=f"review.answer.{label}").proto.type == "primary"
    ]


def _shown(at: AppTest, page_text: Callable[[AppTest], str]) -> str:
    """The id of the answer on the card."""
    text = page_text(at)
    head = next(line for line in text.splitlines() if line.startswith("#### Answer "))
    return head.rsplit("`", 2)[-2]


def test_a_reviewer_marks_whole_answers_in_each_order(
    with_demo_detectors: Path,
    app_env: Path,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    at = open_page(PAGE)
    _start(at, "ann")
    at.radio(key="review.mode").set_value("answers").run()
    no_exception(at)
    assert at.radio(key="review.order").value == "random"
    assert "an unbiased sample of the dataset" in page_text(at)
    ids = [e.id for e in _corpus()]
    order = order_answers(ids, "random", dataset=KEY)
    first = _shown(at, page_text)
    assert first == order[0]  # nothing scanned: the random order, from its start
    assert "Not scanned yet" in page_text(at)
    assert _chosen(at) == []  # no label looks chosen before one is

    at.button(key="review.answer.faithful").click().run()
    no_exception(at)
    assert _shown(at, page_text) == order[1]  # moved on, and answers I marked are skipped
    assert _chosen(at) == []
    at.toggle(key=KEY_A_SKIP_MINE).set_value(False).run()
    at.button(key="review.answer.prev").click().run()
    assert _shown(at, page_text) == first and _chosen(at) == ["faithful"]  # my own mark
    at.toggle(key=KEY_A_SKIP_MINE).set_value(True).run()
    assert _shown(at, page_text) == order[1]
    with Store(app_env) as s:
        (m,) = AnswerBook(s).marks(KEY)
        assert (m.example_id, m.reviewer, m.label, m.drawn_by) == (
            first,
            "ann",
            "faithful",
            "random",
        )
        assert [a.action for a in AnswerBook(s).audit(KEY, first)] == ["create"]

    # scan two answers: the next ones of the random order, with the set's verdicts kept
    at.number_input(key="review.limit").set_value(2)
    at.button(key="review.build").click().run()
    no_exception(at)
    with Store(app_env) as s:
        scanned = AnswerBook(s).scanned(KEY, _corpus())
    assert sorted(scanned) == sorted(order[:2])
    assert all(0 <= v.probability <= 1 and "set " in v.judged_by for v in scanned.values())

    # the uncertainty order: the scanned answer not marked yet comes first, with its verdict
    at.radio(key="review.order").set_value("uncertainty").run()
    no_exception(at)
    assert _shown(at, page_text) == order[1]
    assert "The set says" in page_text(at)
    assert "the reviews that teach a refit most" in page_text(at)
    at.button(key="review.answer.hallucinated").click().run()
    no_exception(at)
    with Store(app_env) as s:
        marks = {m.example_id: m for m in AnswerBook(s).marks(KEY)}
    assert (marks[order[1]].label, marks[order[1]].drawn_by) == ("hallucinated", "uncertainty")

    # a second reviewer disagrees on the first answer: a tie, and the agreement shows
    at.button(key="review.change_name").click().run()
    _start(at, "bob")
    at.radio(key="review.order").set_value("random").run()
    assert _shown(at, page_text) == order[0]
    assert _chosen(at) == []  # ann's mark is not bob's
    at.button(key="review.answer.hallucinated").click().run()
    no_exception(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Answers both labelled"] == "1"
    assert metrics["Answers labelled alike"] == "0%"

    # the export follows the rules: order[0] disputed (left out), order[1] hallucinated
    at.text_input(key="review.export.name").input("reviewed-answers")
    at.button(key="review.export.save").click().run()
    no_exception(at)
    with Store(app_env) as s:
        stored = {e.id: e.label for e in s.load_examples("reviewed-answers")}
        spans = ReviewBook(s).items(KEY)
    assert stored.get(order[1]) is True
    assert order[0] not in stored
    assert set(stored) <= {order[1], *(i.example_id for i in spans)}


def test_a_verdict_scanned_with_the_previous_set_says_so(
    with_demo_detectors: Path,
    app_env: Path,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    """A kept verdict names the set that scanned it; when another set judges the dataset
    now (here the demo detectors, the ``custom`` set), the card says the verdict is the
    previous set's and that scanning again judges with the set in use."""
    at = open_page(PAGE)
    _start(at, "ann")
    at.radio(key="review.mode").set_value("answers").run()
    no_exception(at)
    examples = _corpus()
    first, second = order_answers([e.id for e in examples], "random", dataset=KEY)[:2]
    with Store(app_env) as s:
        AnswerBook(s).record_scan(
            KEY,
            examples,
            {
                first: ScanVerdict(
                    probability=0.8,
                    threshold=0.5,
                    judged_by="set fast, ensemble, pooled calibration",
                ),
                second: ScanVerdict(
                    probability=0.2, threshold=0.5, judged_by="set custom, nll, pooled calibration"
                ),
            },
        )
    at.run()
    no_exception(at)
    assert _shown(at, page_text) == first
    (line,) = [c.value for c in at.caption if c.value.startswith("The set says")]
    assert "(set fast, ensemble, pooled calibration)." in line
    assert (
        "Scanned with the previous set, **fast**; the **custom** set judges this dataset now"
        in line
    )
    assert "Scan again the answers already scanned" in line
    at.button(key="review.answer.next").click().run()
    no_exception(at)
    assert _shown(at, page_text) == second
    (line,) = [c.value for c in at.caption if c.value.startswith("The set says")]
    assert "previous set" not in line  # scanned by the set in use: nothing to say


def _corpus():
    from core.data import load_builtin

    return load_builtin()
