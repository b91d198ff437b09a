"""Training detectors for a model that has none, in a real browser (Chromium) on the
tiny model: start a job from Home, watch its progress on another page and after a
reload, see its artifacts load without a restart; then cancel a second job, which
leaves nothing behind. Screenshot: ``test-artifacts/train_detectors.png``."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from core.base.paths import model_slug
from core.storage import JobRow, Store
from tools.browser import choose, wait_idle

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "test-artifacts" / "streamlit-train.log"
SHOT = REPO / "test-artifacts" / "train_detectors.png"
LOAD_MS = 120_000
JOB_MS = 150_000
TRAIN = "Train detectors for this model"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("train-browser")
    env = {
        "RAGSCOPE_MODEL": "tiny",
        "RAGSCOPE_DEVICE": "cpu",
        "RAGSCOPE_DB": str(root / "ragscope.sqlite3"),
        "RAGSCOPE_DETECTORS_DIR": str(root / "no-detectors"),
        "RAGSCOPE_TRAINED_DIR": str(root / "trained"),
        "RAGSCOPE_SHARED_DATA": str(root / "no-shared"),
        "RAGSCOPE_SHIPPED_RUNS_DIR": str(root / "no-runs"),
        "RAGSCOPE_SAE_DIR": str(root / "no-sae"),
        "OMP_NUM_THREADS": "1",  # the tiny model: more threads only wait
    }
    yield env
    with Store(env["RAGSCOPE_DB"]) as store:  # stop a worker a failed test left running
        for row in store.list_jobs():
            if isinstance(row, JobRow) and row.active and row.pid:
                try:
                    os.kill(row.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="module")
def app_url(env: dict[str, str], launch_streamlit) -> Iterator[str]:
    with launch_streamlit(env, LOG) as url:
        yield url


def _assert_no_exception(page) -> None:
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, boxes.first.inner_text()


def _fill_form(page, detectors: list[str], dataset: str, limit: int) -> None:
    """Open the training form and choose the detectors, the data and the limit."""
    form = page.locator('[data-testid="stExpander"]', has_text=re.compile("detectors for this"))
    form.locator("summary").click()
    picker = page.locator('[data-testid="stMultiSelect"]', has_text="Detectors")
    picker.wait_for(timeout=LOAD_MS)
    box = picker.get_by_role("combobox")
    box.click()
    for _ in range(12):  # every detector is picked at first: remove them all
        box.press("Backspace")
    for name in detectors:
        # Each removal or pick reruns the form (it times an example), which re-renders
        # the list: on a busy machine an option can be replaced under the click.
        for attempt in range(5):
            wait_idle(page, LOAD_MS)
            box.fill(name)
            try:
                page.get_by_role("option", name=name, exact=True).click(timeout=10_000)
                break
            except PlaywrightTimeout:
                if attempt == 4:
                    raise
    page.keyboard.press("Escape")
    command = page.get_by_text(re.compile(r"The same from a terminal"))
    expect(command).to_contain_text("--detectors " + ",".join(detectors), timeout=LOAD_MS)
    choose(page, "Training data", dataset, LOAD_MS)
    spin = page.get_by_role("spinbutton", name="Example limit")
    spin.fill(str(limit))
    spin.press("Enter")
    expect(command).to_contain_text(f"--limit {limit}", timeout=LOAD_MS)
    page.get_by_text(re.compile(r"examples to trace")).wait_for(timeout=LOAD_MS)


def test_train_switch_reload_appear_and_cancel(
    app_url: str, env: dict[str, str], open_chromium, tiny_model
) -> None:
    trained = Path(env["RAGSCOPE_TRAINED_DIR"]) / model_slug(tiny_model.info.key)
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url)
        page.get_by_role("heading", name="ragscope").wait_for(timeout=LOAD_MS)
        page.get_by_text("No detectors are trained for this model yet").wait_for()

        _fill_form(page, ["nll", "context_gain"], "Built-in labelled corpus", 200)
        page.get_by_role("button", name=re.compile("Train in the background")).click()
        panel = page.locator('[data-testid="stVerticalBlock"]', has_text="Job #1").last
        page.get_by_text(re.compile(r"^Job #1: ")).wait_for(timeout=LOAD_MS)
        expect(page.locator('[data-testid="stProgress"]')).to_have_count(1)
        page.get_by_role("button", name=re.compile("Cancel")).wait_for()
        page.get_by_text(re.compile(r"Features: \d+ / \d+ examples")).wait_for(timeout=JOB_MS)
        panel.scroll_into_view_if_needed()
        SHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOT))

        # Another page shows the same job, and so does the page after a reload.
        page.locator('[data-testid="stSidebarNav"] a', has_text="Heads & layers").click()
        page.get_by_role("heading", name="Heads & layers").wait_for(timeout=LOAD_MS)
        page.get_by_text(re.compile(r"^Job #1: ")).wait_for(timeout=LOAD_MS)
        page.reload()
        page.get_by_role("heading", name="Heads & layers").wait_for(timeout=LOAD_MS)
        page.get_by_text(re.compile(r"^Job #1: ")).wait_for(timeout=LOAD_MS)

        # It finishes; the page reruns by itself and the detectors load (no restart).
        sidebar = page.locator('[data-testid="stSidebar"]')
        sidebar.get_by_text(re.compile(r"trained set · 2 for this model")).wait_for(timeout=JOB_MS)
        page.get_by_text(re.compile(r"^Job #1: .* finished.*They are loaded now")).wait_for()
        expect(page.locator('[data-testid="stProgress"]')).to_have_count(0)
        _assert_no_exception(page)
        assert sorted(p.name for p in trained.iterdir()) == ["context_gain", "nll"]

        # A second job from Home, cancelled while it extracts: nothing of it is written.
        page.locator('[data-testid="stSidebarNav"] a', has_text="Home").click()
        page.get_by_text(re.compile(r"Job #1: .* finished")).wait_for(timeout=LOAD_MS)
        _fill_form(page, ["lookback_lens"], "Built-in labelled corpus", 600)
        page.get_by_role("button", name=re.compile("Train in the background")).click()
        page.get_by_text(re.compile(r"Features: \d+ / \d+ examples")).wait_for(timeout=JOB_MS)
        page.get_by_role("button", name=re.compile("Cancel")).click()
        page.get_by_text(re.compile(r"Job #2: .* was cancelled")).wait_for(timeout=JOB_MS)
        _assert_no_exception(page)
        assert sorted(p.name for p in trained.iterdir()) == ["context_gain", "nll"]
        assert sorted(p.name for p in trained.parent.iterdir()) == [trained.name]
        page.close()
