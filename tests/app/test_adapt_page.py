"""The Review page's loop (AppTest, tiny model, a calibrated set): whole answers marked
in the random order, the panel counting them and saying how many more it needs, the
adaptation started as a background job, and the adapted set judging the dataset's
answers on the page afterwards."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from core.data import load_builtin
from core.review import AnswerBook
from core.services.jobs import job_view
from core.storage import Store

PAGE = "views/review.py"
NAME = "mine"
KEY = f"store:{NAME}"
WAIT_S = 180.0


@pytest.fixture
def review_env(
    calibrated_tiny_set: tuple[Path, Path], app_env: Path, monkeypatch: pytest.MonkeyPatch
) -> list:
    """The calibrated set as the app's detectors and a stored dataset of 40 answers."""
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(calibrated_tiny_set[0]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    answers = [
        dataclasses.replace(e, provenance=dataclasses.replace(e.provenance, dataset=NAME))
        for e in load_builtin()
        if e.task == "qa"
    ][200:240]
    with Store(app_env) as s:
        s.import_dataset(NAME, answers, source="test", fmt="ragscope")
        return s.load_examples(NAME)


def test_reviews_adapt_the_set_in_the_background_and_the_page_reads_the_adapted_set(
    review_env: list,
    app_env: Path,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    at = open_page(PAGE)
    at.text_input(key="review.name").input("ann")
    at.button(key="review.start").click().run()
    at.selectbox(key="review.dataset").set_value(KEY).run()
    at.radio(key="review.mode").set_value("answers").run()
    no_exception(at)
    assert "No set is adapted to `mine` yet" in page_text(at)
    assert "Not yet: 0 answers reviewed in the random order" in page_text(at)
    assert at.button(key="review.adapt.start").disabled
    gold = {e.id: e.label for e in review_env}
    for _ in range(24):  # mark 24 answers by their gold labels, in the page's order
        shown = next(
            line for line in page_text(at).splitlines() if line.startswith("#### Answer ")
        ).rsplit("`", 2)[-2]
        which = "hallucinated" if gold[shown] else "faithful"
        at.button(key=f"review.answer.{which}").click().run()
    no_exception(at)
    metrics = {m.label: m.value for m in at.metric}
    with Store(app_env) as s:
        marks = AnswerBook(s).marks(KEY)
    assert len(marks) == 24 and {m.drawn_by for m in marks} == {"random"}
    n_h = sum(gold[m.example_id] for m in marks)
    assert metrics["Hallucinated, drawn at random"] == str(n_h)
    assert metrics["Faithful, drawn at random"] == str(24 - n_h)
    assert not at.button(key="review.adapt.start").disabled
    # the job judges the 24 labelled answers: the time it will take is said beforehand
    assert "Estimated time on this machine" in page_text(at)

    # this set has no ensemble: nothing to refit
    assert at.toggle(key="review.adapt.refit").disabled
    assert at.toggle(key="review.adapt.refit").value is False
    at.button(key="review.adapt.start").click().run()
    with Store(app_env) as s:
        deadline = time.monotonic() + WAIT_S
        while True:
            view = job_view(s.latest_job(s.list_jobs()[0].model, kind="adapt"))
            if not view.active or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    assert view.state == "done", view.row.error
    assert view.row.spec["refit"] is False and view.row.result["refit"] == ""
    at.run()
    no_exception(at)
    text = page_text(at) + "\n".join(x.value for x in at.success)
    assert "set judges `mine`'s answers" in text and "adapted from 24 reviewed answers" in text
    # the answer card now shows the adapted set's verdict
    at.button(key="review.build").click().run()  # scan: the set's verdicts are kept
    no_exception(at)
    with Store(app_env) as s:
        scanned = AnswerBook(s).scanned(KEY, review_env)
    assert scanned and all("custom+mine" in v.judged_by for v in scanned.values())
    at.toggle(key="review.answer.skip_mine").set_value(False)  # the scanned ones are marked
    at.radio(key="review.order").set_value("uncertainty").run()  # a scanned answer first
    assert "The set says" in page_text(at) and "custom+mine" in page_text(at)
