"""The review loop in a real browser (Chromium, tiny model, a calibrated set with an
ensemble): a reviewer marks whole answers with the keyboard in the random order, starts
the adaptation (the ensemble's stacker refitted too, the page's default), and the page
then judges the dataset's answers with the adapted set. Its screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from core.data import load_builtin
from core.review import AnswerBook
from core.storage import Store
from tools.browser import choose, wait_idle

pytestmark = [pytest.mark.browser]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
NAME = "mine"
QUEUE = f"store:{NAME}"
N_MARKS = 24
LOAD_MS = 120_000
JOB_MS = 240_000


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bool]]:
    """A database holding the dataset ``mine`` (40 built-in QA answers, renamed) and the
    gold label of each."""
    path = tmp_path_factory.mktemp("loop-db") / "ragscope.sqlite3"
    answers = [
        dataclasses.replace(e, provenance=dataclasses.replace(e.provenance, dataset=NAME))
        for e in load_builtin()
        if e.task == "qa"
    ][200:240]
    with Store(path) as s:
        s.import_dataset(NAME, answers, source="test", fmt="ragscope")
    return path, {e.id: bool(e.label) for e in answers}


@pytest.fixture(scope="module")
def app_url(
    db: tuple[Path, dict[str, bool]],
    calibrated_tiny_ensemble_set: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    launch_streamlit,
) -> Iterator[str]:
    ARTIFACTS.mkdir(exist_ok=True)
    env = {
        "RAGSCOPE_MODEL": "tiny",
        "RAGSCOPE_DEVICE": "cpu",
        "RAGSCOPE_DB": str(db[0]),
        "RAGSCOPE_DETECTORS_DIR": str(calibrated_tiny_ensemble_set[0]),
        "RAGSCOPE_CACHE_DIR": str(calibrated_tiny_ensemble_set[1]),
        "RAGSCOPE_TRAINED_DIR": str(tmp_path_factory.mktemp("loop-trained")),
        "RAGSCOPE_WARM_DETECTORS": "0",
        "OMP_NUM_THREADS": "1",
    }
    with launch_streamlit(env, ARTIFACTS / "streamlit-review-loop.log") as url:
        yield url


def test_marked_answers_adapt_the_set_and_the_page_judges_with_it(
    app_url: str, db: tuple[Path, dict[str, bool]], open_chromium
) -> None:
    path, gold = db
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 1100})
        page.goto(f"{app_url}/review", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Review flagged spans").wait_for(timeout=LOAD_MS)
        page.get_by_label("Your name", exact=True).fill("ann")
        page.get_by_role("button", name="Start reviewing").click()
        page.get_by_text("Reviewing as").wait_for()
        choose(page, "Dataset", re.compile(rf"^Imported: {NAME}"), LOAD_MS)
        wait_idle(page, LOAD_MS)
        page.get_by_text("Whole answers", exact=True).click()
        page.get_by_text("No set is adapted to").wait_for(timeout=LOAD_MS)
        heading = page.get_by_role("heading", name=re.compile(r"^Answer \d+ of 40"))
        for _ in range(N_MARKS):
            wait_idle(page, LOAD_MS)
            shown = heading.inner_text().rsplit(" ", 1)[-1]
            key = "h" if gold[shown] else "f"  # the page's keyboard shortcuts
            page.evaluate("document.activeElement && document.activeElement.blur()")
            page.keyboard.press(key)
            expect(page.get_by_text(re.compile(rf"{re.escape(shown)}.? marked"))).to_be_visible(
                timeout=LOAD_MS
            )
        wait_idle(page, LOAD_MS)
        with Store(path) as s:
            marks = AnswerBook(s).marks(QUEUE)
        assert len(marks) == N_MARKS and all(
            gold[m.example_id] == (m.label == "hallucinated") for m in marks
        )
        page.screenshot(path=str(ARTIFACTS / "review_answers.png"), full_page=True)

        page.get_by_role("button", name="Adapt in the background").click()
        done = page.get_by_text(
            re.compile(r"set judges `?mine`?'s answers|set judges mine's answers")
        )
        done.first.wait_for(timeout=JOB_MS)
        adapted = page.get_by_text(re.compile("adapted from")).first.inner_text()
        assert "adapted from 24 reviewed answers" in adapted
        # the refit is on by default: the job says whether it kept the stacker, and why
        finished = page.get_by_text(re.compile(r"^Adaptation job #\d+ finished")).inner_text()
        assert "AUROC" in finished, finished
        kept = "Refit: the ensemble's stacker" in finished
        assert kept or "No refit: " in finished, finished
        assert ("its ensemble refitted on them" in adapted) == kept
        page.get_by_role("button", name=re.compile("Scan and queue")).click()
        wait_idle(page, JOB_MS)
        page.get_by_text("Skip answers I marked").click()  # the scanned answers are marked
        wait_idle(page, LOAD_MS)
        page.get_by_text("nearest the threshold first").click()
        wait_idle(page, LOAD_MS)
        verdict = page.get_by_text(re.compile(r"The set says"))
        verdict.first.wait_for(timeout=LOAD_MS)
        assert "custom+mine" in verdict.first.inner_text()
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(ARTIFACTS / "review_adapted.png"), full_page=True)
        page.close()
