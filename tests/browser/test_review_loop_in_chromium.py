"""The review loop in a real browser (Chromium, tiny model, a calibrated set with an
ensemble), walked as a teacher would (issue 67): a Counterfactual is compared with the
base set; a reviewer marks whole answers with the keyboard in the random order and starts
the adaptation (the ensemble's stacker refitted too, the page's default); then the
sidebar names the adapted set, the Counterfactual marks its kept result as the previous
set's and judges again with the adapted one, and the Playground, Counterfactual,
Mitigation and ``ragscope judge`` show the same verdict on the same faithful answer, no
detector flagging it at a constant score. Its screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from core.cli import main
from core.data import load_builtin
from core.review import AnswerBook
from core.storage import Store
from tools.browser import choose, full_page_screenshot, wait_idle

pytestmark = [pytest.mark.browser]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
NAME = "mine"
QUEUE = f"store:{NAME}"
N_MARKS = 20  # the fewest that adapt (20, 5 of each class), as a reviewer would
LOAD_MS = 120_000
JOB_MS = 240_000
ACTION_MS = 120_000


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
) -> Iterator[tuple[str, dict[str, str]]]:
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
        yield url, env


def _cli_record(
    env: dict[str, str], out: Path, example_id: str, monkeypatch: pytest.MonkeyPatch
) -> dict:
    """``ragscope judge`` on the dataset with the server's environment (its database, set
    and trained folders; here, not in a process of its own: the rule it reads is the
    same, and a process would load torch again): the record of one answer."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["judge", f"stored:{NAME}", "--model", "tiny", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return next(r for r in records if r["id"] == example_id)


def _go(page, title: str) -> None:
    """Open the page ``title`` through the sidebar (the session and what it keeps stay)."""
    wait_idle(page, LOAD_MS)
    page.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    page.get_by_role("heading", name=title).first.wait_for(timeout=LOAD_MS)
    wait_idle(page, LOAD_MS)


def _verdict_line(page) -> str:
    """The Playground's (or a page's) overall verdict line, once drawn."""
    line = page.get_by_text(re.compile(r"^(Hallucinated|Faithful): .* p = ")).first
    line.wait_for(timeout=ACTION_MS)
    return line.inner_text()


def test_marked_answers_adapt_the_set_and_every_page_and_the_cli_judge_with_it(
    app_url: tuple[str, dict[str, str]],
    db: tuple[Path, dict[str, bool]],
    open_chromium,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, env = app_url
    path, gold = db
    faithful = next(i for i, hallucinated in gold.items() if not hallucinated)
    cf_link = f"{url}/counterfactual?dataset={NAME}&example={faithful}"
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 1100})
        # Before any review: a comparison judged by the base set, kept in the session.
        page.goto(cf_link, wait_until="domcontentloaded")
        page.get_by_role("heading", name="Counterfactual context").wait_for(timeout=LOAD_MS)
        wait_idle(page, LOAD_MS)
        page.get_by_role("button", name=re.compile("^Compare")).click()
        page.get_by_role("heading", name=re.compile(r"^Original vs edited")).wait_for(
            timeout=ACTION_MS
        )
        wait_idle(page, LOAD_MS)
        assert page.get_by_text("computed with the previous set").count() == 0

        # The same session from here on: pages opened through the sidebar (a new URL
        # would start a new session, without the comparison kept above).
        _go(page, "Review")
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
        full_page_screenshot(page, ARTIFACTS / "review_answers.png")

        page.get_by_role("button", name="Adapt in the background").click()
        done = page.get_by_text(
            re.compile(r"set judges `?mine`?'s answers|set judges mine's answers")
        )
        done.first.wait_for(timeout=JOB_MS)
        adapted = page.get_by_text(
            re.compile(r"adapted from \d+ reviewed answers")
        ).first.inner_text()
        assert f"adapted from {N_MARKS} reviewed answers" in adapted
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
        full_page_screenshot(page, ARTIFACTS / "review_adapted.png")
        _walk_after_adapting(page, faithful, env, tmp_path, monkeypatch)
        page.close()


def _walk_after_adapting(
    page, faithful: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the adaptation: the sidebar, the Counterfactual's kept result, and the same
    faithful answer on the Playground, the Counterfactual, Mitigation and the CLI."""
    cli = _cli_record(env, tmp_path / "v.jsonl", faithful, monkeypatch)
    adapted = cli["set"]
    assert adapted.startswith(f"custom+{NAME}-") and cli["set_id"].startswith(f"{adapted}@")
    p, t = cli["probability"], cli["threshold"]

    # The Counterfactual's comparison from before is marked as the previous set's.
    _go(page, "Counterfactual context")
    page.get_by_role("heading", name=re.compile(r"^Original vs edited")).wait_for(timeout=LOAD_MS)
    stale = page.get_by_text(re.compile("computed with the previous set, the custom set"))
    stale.first.wait_for(timeout=LOAD_MS)
    # no verdict line of the set in use beside the previous set's scores
    assert page.get_by_text(re.compile(r"^Original: (Hallucinated|Faithful)")).count() == 0
    sidebar = page.locator('[data-testid="stSidebar"]')
    expect(sidebar).to_contain_text(f"Judging {NAME}: the {adapted} set (adapted from {N_MARKS}")
    expect(sidebar).to_contain_text(cli["set_id"])
    full_page_screenshot(page, ARTIFACTS / "counterfactual_previous_set.png")
    wait_idle(page, LOAD_MS)
    page.get_by_role("button", name=re.compile("^Compare")).click()
    expect(stale.first).to_have_count(0, timeout=ACTION_MS)
    line = page.get_by_text(re.compile(r"^Original: (Hallucinated|Faithful): ")).first
    line.wait_for(timeout=ACTION_MS)
    cf_text = line.inner_text()
    assert f"p = {p:.2f}" in cf_text and f"{t:.2f}" in cf_text and adapted in cf_text, cf_text

    # The Playground: the same numbers, and no detector flags this faithful answer at a
    # constant score (a calibration without signal says "no signal" and makes no call).
    _go(page, "Playground")
    choose(page, "Example", re.compile(re.escape(faithful)), LOAD_MS)
    wait_idle(page, LOAD_MS)
    page.get_by_text("Paste an answer", exact=True).click()
    wait_idle(page, LOAD_MS)
    page.get_by_role("button", name=re.compile("Analyse")).click()
    page.get_by_role("heading", name="Detector verdicts").wait_for(timeout=ACTION_MS)
    wait_idle(page, LOAD_MS)
    pg_text = _verdict_line(page)
    assert f"p = {p:.2f}" in pg_text and f"{t:.2f}" in pg_text and adapted in pg_text, pg_text
    assert pg_text.startswith("Hallucinated" if cli["hallucinated"] else "Faithful")
    table = page.locator('[data-testid="stTable"]', has_text="calibrated for").first
    rows = table.locator("tbody tr")
    assert rows.count() == cli["n_detectors"]
    for r in range(rows.count()):
        cells = rows.nth(r).locator("td").all_inner_texts()
        name, score, threshold, call = cells[0], cells[1], cells[2], cells[3]
        want = cli["detectors"][name]
        assert call == want["call"], (name, call, want)
        assert score == f"{want['probability']:.3f}", (name, score, want)
        assert not (call == "flagged" and score == threshold), (name, score, threshold)
    full_page_screenshot(page, ARTIFACTS / "playground_adapted.png")

    # Mitigation: the original answer's column is the same verdict.
    _go(page, "Mitigation")
    # the Playground's answer, the one just analysed, is the page's answer
    page.get_by_text(re.compile(r"^Feedback turn sent")).first.wait_for(timeout=LOAD_MS)
    temperature = page.get_by_role("spinbutton", name="Temperature")
    temperature.fill("1.0")  # greedy, the random tiny model can write nothing new
    temperature.press("Enter")
    wait_idle(page, LOAD_MS)
    page.get_by_role("button", name=re.compile("Regenerate")).click()
    page.locator(".rs-answer-diff").wait_for(state="visible", timeout=ACTION_MS)
    wait_idle(page, LOAD_MS)
    grid = page.locator('[data-testid="stDataFrame"]', has_text="overall").first
    cells = grid.locator('[role="gridcell"]').all_inner_texts()
    at = cells.index(f"overall ({cli['judge']})")
    # the grid's accessible cells hold the values unrounded: threshold and original
    numbers = [float(c) for c in cells[at + 1 : at + 3]]
    assert any(abs(x - p) < 1e-9 for x in numbers), (p, cells[:12])
    assert any(abs(x - t) < 1e-9 for x in numbers), (t, cells[:12])
    assert page.get_by_text("computed with the previous set").count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0
    full_page_screenshot(page, ARTIFACTS / "mitigation_adapted.png")
