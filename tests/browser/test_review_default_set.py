"""The Review page's scan in a real browser (Chromium) with the shipped default detector
set on the embedded model: by default it queues the set's spans of the demo answers
(one decision per answer, by the set's ensemble), whole words, never a span of
punctuation or spaces alone (issue 37), each shown with its type, reason and the passage
text it departs from or that none supports it (issue 51).

The server reads the shipped default set (no ``RAGSCOPE_DETECTORS_DIR``), its own
database and its own cache dir (sharing the session's model cache, so the embedded
model is not dequantized again).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from core.data import builtin_examples
from core.review import ReviewBook, random_order
from core.storage import Store
from tools.browser import choose, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.embedded]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
MODEL_LOAD_MS = 240_000  # a cold cache dequantizes the embedded GGUF first
SCAN_MS = 900_000  # every member of the ensemble on four answers, on a busy small CPU
QUEUE = "builtin:demo"  # the Review queue of the built-in demo examples
FLAGGED = "demo-04-mount-kelsey"  # the set flags its invented builder and year
# A scan reads the next answers of the queue's fixed random order: as many as it takes
# to reach the flagged one.
N_SCAN = (
    random_order([e.id for e in builtin_examples() if e.id.startswith("demo-")], QUEUE).index(
        FLAGGED
    )
    + 1
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("review-default-db") / "ragscope.sqlite3"


@pytest.fixture(scope="module")
def app_url(db: Path, tmp_path_factory: pytest.TempPathFactory, launch_streamlit) -> Iterator[str]:
    shared = Path(os.environ["RAGSCOPE_CACHE_DIR"]).expanduser() / "models"
    shared.mkdir(parents=True, exist_ok=True)
    cache = tmp_path_factory.mktemp("review-default-cache")
    (cache / "models").symlink_to(shared, target_is_directory=True)
    ARTIFACTS.mkdir(exist_ok=True)
    env = {
        "RAGSCOPE_MODEL": "embedded",
        "RAGSCOPE_DEVICE": "cpu",
        "RAGSCOPE_CACHE_DIR": str(cache),
        "RAGSCOPE_DB": str(db),
        "RAGSCOPE_DETECTORS_DIR": "",  # the shipped default set
        "RAGSCOPE_DETECTOR_SET": "",
    }
    with launch_streamlit(env, ARTIFACTS / "streamlit-review-default.log") as url:
        yield url


def test_the_default_set_queues_word_spans_of_the_demo(
    app_url: str, db: Path, open_chromium
) -> None:
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(f"{app_url}/review", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Review flagged spans").wait_for(timeout=MODEL_LOAD_MS)
        page.get_by_label("Your name", exact=True).fill("ann")
        page.get_by_role("button", name="Start reviewing").click()
        page.get_by_text("Reviewing as").wait_for()
        choose(page, "Dataset", re.compile("^Built-in demo examples"), MODEL_LOAD_MS)
        page.wait_for_url(re.compile(r"dataset=demo"))
        # The rerun replaces the previous dataset's scan form (its maximum is that
        # dataset's size): until it ends, both can stand on the page.
        wait_idle(page, SCAN_MS)
        scan = page.get_by_label("Answers to scan")
        expect(scan).to_have_count(1, timeout=SCAN_MS)
        expect(scan).to_have_attribute("max", str(len(builtin_examples())))
        scan.fill(str(N_SCAN))
        scan.press("Enter")
        # The rerun redraws the scan form (and times one answer for the estimate): until it
        # ends, the old form can stand beside the new one.
        wait_idle(page, SCAN_MS)
        # the set's spans by default, once: a stale copy of the form is gone
        expect(page.get_by_text("Flag spans by", exact=True)).to_have_count(1, timeout=SCAN_MS)
        page.get_by_role("button", name=re.compile("Scan and queue")).click()
        report = page.get_by_text(re.compile(rf"^Scanned {N_SCAN} answers: "))
        report.wait_for(timeout=SCAN_MS)
        assert re.match(
            rf"Scanned {N_SCAN} answers: the set calls [1-9]\d* hallucinated and flags "
            r"[1-9]\d* spans?",
            report.inner_text(),
        ), report.inner_text()
        page.get_by_role(
            "heading", name=re.compile(r"^Item \d+ \(1 of \d+ in this queue\)")
        ).wait_for()
        shown = page.locator(".rs-marked mark").last.inner_text()  # the answer's flagged span
        assert re.search(r"\w", shown), shown
        # where it departs from: its type and reason, and the passages' evidence or none
        finding = page.get_by_text(re.compile(r"^(Unsupported|Contradicted): \S"))
        expect(finding.first).to_be_visible()
        expect(
            page.get_by_text(re.compile(r"^Passages \((the evidence in blue|no passage supports)"))
        ).to_have_count(1)
        # the Type comes prefilled from the finding, so one keystroke accepts it
        prefilled = page.get_by_role(
            "radio", name=re.compile("^(baseless|conflict)$"), checked=True, include_hidden=True
        )
        expect(prefilled).to_have_count(1)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(ARTIFACTS / "review_default_set.png"), full_page=True)
        page.close()
    answers = {e.id: e.response for e in builtin_examples()}
    with Store(db) as s:
        items = ReviewBook(s).items(QUEUE)
    texts = [answers[i.example_id][i.start : i.end] for i in items]
    assert texts, "the default set queued no span"
    assert all(set(i.sources) == {"ensemble"} for i in items), [i.sources for i in items]
    assert all(re.search(r"\w", t) for t in texts), texts  # never punctuation alone
    assert all(t == t.strip() for t in texts), texts
    for i, t in zip(items, texts, strict=True):  # whole words: no word cut at either end
        a = answers[i.example_id]
        assert i.start == 0 or not (a[i.start - 1].isalnum() and a[i.start].isalnum()), t
        assert i.end == len(a) or not (a[i.end - 1].isalnum() and a[i.end].isalnum()), t
