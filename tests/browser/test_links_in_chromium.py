"""Deep links in a real browser (Chromium), on the tiny model.

A link names the page (its URL path) and, in its query string, the view's choices:
opening one shows the same example, head or SAE feature, and changing a control
rewrites the URL. The server runs ``streamlit run app/main.py`` on the tiny model
with a raglens detector fitted here (on the demo examples, with the small test SAE),
so the GAM page has features to link to.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from core.data import builtin_examples
from core.detectors import make_detector
from core.engine.model import LoadedModel
from core.evaluation.evaluate import DetectorResult, EvalRun
from core.learning.metrics import response_metrics
from core.pipeline.extract import extract_features
from tools.browser import wait_idle

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "test-artifacts" / "streamlit-links.log"
LOAD_MS = 120_000
EXAMPLE = "demo-04-mount-kelsey"  # not the example the pages start from


@pytest.fixture(scope="module")
def raglens_dir(tiny_model: LoadedModel, tiny_sae, tmp_path_factory) -> tuple[Path, int]:
    """A detectors folder with raglens for the tiny model; and a feature it selected
    (not its top one)."""
    out = tmp_path_factory.mktemp("links-detectors")
    examples = builtin_examples()
    det = make_detector("raglens", sae=str(tiny_sae.path), top_k=8, max_rounds=200)
    nll = make_detector("nll")
    feats = extract_features(tiny_model, examples, [det, nll]).features
    det.fit(list(feats["raglens"]), examples).save(out / "raglens")
    nll.fit(list(feats["nll"]), examples).save(out / "nll")  # Agreement needs two
    return out, det.importances()[2][0]


def _saved_run(name: str, created_at: str, seed: int) -> EvalRun:
    """A held-out run of nll and raglens on seeded scores, for the Benchmark's picker."""
    rng = np.random.default_rng(seed)
    y = np.arange(40) % 2
    results = []
    for det in ("nll", "raglens"):
        s = np.clip(0.4 + 0.2 * y + rng.normal(0, 0.2, y.size), 0, 1).round(4)
        results.append(
            DetectorResult(
                detector=det,
                config_hash=f"{det}-{seed}",
                threshold=0.5,
                metrics=response_metrics(y, s, 0.5, n_boot=50),
                token_metrics=None,
                validation_metrics=None,
                scores=tuple(float(v) for v in s),
            )
        )
    return EvalRun(
        name=name,
        created_at=created_at,
        model="tiny",
        train_dataset="synthetic",
        test_dataset="synthetic",
        data_hashes={"train": "a", "validation": "b", "test": "c"},
        split_sizes={"train": 100, "validation": 20, "test": y.size},
        test_ids=tuple(f"t{i}" for i in range(y.size)),
        test_labels=tuple(int(v) for v in y),
        test_tasks=("qa",) * y.size,
        test_generators=("gen",) * y.size,
        results=tuple(results),
        extraction={"computed": 0, "cache_hits": 0, "seconds": 1.0, "examples_per_minute": 1.0},
    )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """The server's own cache dir: the session's models, two saved runs and nothing else
    (a developer's runs under ~/.cache must not change the Benchmark's defaults)."""
    shared = Path(os.environ["RAGSCOPE_CACHE_DIR"]).expanduser() / "models"
    shared.mkdir(parents=True, exist_ok=True)
    cache = tmp_path_factory.mktemp("links-cache")
    (cache / "models").symlink_to(shared, target_is_directory=True)
    _saved_run("20260102-run-older", "2026-01-02T00:00:00+00:00", 1).save(cache / "runs")
    _saved_run("20260103-run-newer", "2026-01-03T00:00:00+00:00", 2).save(cache / "runs")
    return cache


@pytest.fixture(scope="module")
def app_url(raglens_dir, tiny_sae, cache_dir, tmp_path_factory, launch_streamlit) -> Iterator[str]:
    env = {
        "RAGSCOPE_CACHE_DIR": str(cache_dir),
        "RAGSCOPE_MODEL": "tiny",
        # The artifact names the tiny SAE's folder, which the operator trusts.
        "RAGSCOPE_SAE_DIR": str(tiny_sae.path),
        "RAGSCOPE_DEVICE": "cpu",
        "RAGSCOPE_DB": str(tmp_path_factory.mktemp("links-db") / "ragscope.sqlite3"),
        "RAGSCOPE_DETECTORS_DIR": str(raglens_dir[0]),
        "RAGSCOPE_SHARED_DATA": str(tmp_path_factory.mktemp("no-shared")),
        "RAGSCOPE_SHIPPED_RUNS_DIR": str(tmp_path_factory.mktemp("no-runs")),
    }
    with launch_streamlit(env, LOG) as url:
        yield url


@pytest.fixture(scope="module")
def chromium(app_url: str, open_chromium) -> Iterator[object]:
    """One Chromium for the module; each view opens in a context of its own (its own
    cookies, storage and app session, as a fresh browser would)."""
    with open_chromium() as browser:
        yield browser


def _selectbox(page, label: str):
    """The select box labelled exactly ``label`` ("Example" is not "Examples")."""
    return page.get_by_role("combobox", name=label, exact=True)


def test_deep_links_reopen_the_view_and_controls_rewrite_the_url(
    app_url: str, raglens_dir: tuple[Path, int], chromium
) -> None:
    feature = raglens_dir[1]
    with chromium.new_context(viewport={"width": 1400, "height": 1000}) as context:
        page = context.new_page()
        plots = page.locator(".js-plotly-plot")

        # Heads & layers on an example and a head.
        page.goto(f"{app_url}/heads?dataset=demo&example={EXAMPLE}&head=L1H2")
        page.get_by_role("heading", name="Heads & layers").wait_for(timeout=LOAD_MS)
        plots.filter(has_text="Attention of L1H2").wait_for(state="visible", timeout=LOAD_MS)
        wait_idle(page, LOAD_MS)  # its estimate's timing over, and the rerun that follows
        expect(_selectbox(page, "Example")).to_have_value(re.compile(f"^{EXAMPLE} "))
        expect(_selectbox(page, "Layer")).to_have_value("L1")
        expect(_selectbox(page, "Head")).to_have_value("H2")
        # Another layer: the URL follows.
        wait_idle(page, LOAD_MS)
        _selectbox(page, "Layer").click()
        page.keyboard.type("L0")
        page.get_by_role("option", name="L0", exact=True).click()
        plots.filter(has_text="Attention of L0H2").wait_for(state="visible", timeout=LOAD_MS)
        page.wait_for_url(re.compile(r"[?&]head=L0H2(&|$)"), timeout=30_000)
        assert f"example={EXAMPLE}" in page.url
        page.screenshot(path=str(LOG.with_name("links-heads.png")))
        # Another page through the sidebar: its own choices, none of Heads' left over.
        wait_idle(page, LOAD_MS)
        page.locator('[data-testid="stSidebarNav"] a', has_text="Token heatmaps").click()
        page.get_by_role("heading", name="Token heatmaps").wait_for(timeout=LOAD_MS)
        page.locator(".rs-mr").wait_for(state="visible", timeout=LOAD_MS)
        page.wait_for_url(re.compile(r"/token_heatmaps\?(.*&)?example="), timeout=30_000)
        assert "head=" not in page.url, page.url

        # Token heatmaps on an example with p_stay set.
        page.goto(f"{app_url}/token_heatmaps?dataset=demo&example={EXAMPLE}&p_stay=0.8")
        page.get_by_role("heading", name="Token heatmaps").wait_for(timeout=LOAD_MS)
        page.locator(".rs-mr").wait_for(state="visible", timeout=LOAD_MS)
        expect(_selectbox(page, "Example")).to_have_value(re.compile(f"^{EXAMPLE} "))
        expect(page.locator('[data-testid="stSlider"]', has_text="p_stay")).to_contain_text("0.800")

        # GAM shape functions on a feature and an example.
        page.goto(f"{app_url}/gam?feature=F{feature}&dataset=demo&example={EXAMPLE}")
        page.get_by_role("heading", name="GAM shape functions").wait_for(timeout=LOAD_MS)
        plots.filter(has_text=f"Shape function of SAE feature F{feature}").wait_for(
            state="visible", timeout=LOAD_MS
        )
        expect(_selectbox(page, "Feature")).to_have_value(f"F{feature} (rank 3)")
        expect(_selectbox(page, "Example")).to_have_value(re.compile(f"^{EXAMPLE} "))
        page.get_by_text(re.compile(r"RAGLens score")).first.wait_for(timeout=LOAD_MS)
        # Every figure downloads as SVG and PNG, rendered on the server.
        wait_idle(page, LOAD_MS)
        svgs = page.locator('[data-testid="stDownloadButton"]', has_text="SVG")
        assert svgs.count() == plots.count() >= 2
        texts = []
        for i in range(svgs.count()):
            with page.expect_download(timeout=LOAD_MS) as got:
                svgs.nth(i).click()
            assert got.value.suggested_filename.endswith(".svg")
            texts.append(Path(got.value.path()).read_bytes())
        assert all(t.startswith(b"<svg") for t in texts)
        assert any(f"Shape function of SAE feature F{feature}".encode() in t for t in texts)
        with page.expect_download(timeout=LOAD_MS) as got:
            page.locator('[data-testid="stDownloadButton"]', has_text="PNG").first.click()
        assert Path(got.value.path()).read_bytes().startswith(b"\x89PNG")

        # A link to a head the model does not have says so.
        page.goto(f"{app_url}/heads?head=L9H9")
        page.get_by_text(re.compile(r"This link names the head L9H9")).wait_for(timeout=LOAD_MS)
        page.wait_for_url(re.compile(r"[?&]head=L\d+H\d+"), timeout=30_000)
        assert "L9H9" not in page.url
        page.close()


VIEW_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const q = (el, s) => el.querySelector(s);
  const busy = '[data-testid="stSkeleton"], [data-testid="stSkeletonElement"], ' +
    '[data-testid="stAppSkeleton"], [data-stale="true"]';
  if (document.querySelector(busy)) return null;  // still drawing
  const out = [];
  const sel = ['h1', 'h2', 'h3', '[data-testid="stSelectbox"]', '[data-testid="stMultiSelect"]',
    '[data-testid="stRadio"]', '[data-testid="stSlider"]', '[data-testid="stNumberInput"]',
    '[data-testid="stCheckbox"]', '[data-testid="stTextArea"]', '[data-testid="stProgress"]'];
  for (const el of main.querySelectorAll(sel.join(','))) {
    const kind = el.getAttribute('data-testid') || el.tagName;
    const label = (q(el, 'label') || el).innerText.split('\\n')[0].trim();
    let value;
    if (kind === 'stRadio') {
      const c = q(el, 'input:checked');
      value = c ? c.closest('label').innerText.trim() : null;
    } else if (kind === 'stSelectbox' || kind === 'stNumberInput') value = q(el, 'input').value;
    else if (kind === 'stCheckbox') value = q(el, 'input').checked;
    else if (kind === 'stTextArea') value = q(el, 'textarea').value;
    else value = el.innerText.trim();
    out.push([kind, label, value]);
  }
  return out;
}"""
"""What a view shows, as data: its headings, and each widget's label and value."""


def _view(page: Page) -> list[list[object]]:
    """The view once it has settled: two readings agree, each taken once the page has been
    idle (no run going, no element still drawing) for a while, with no model loading."""
    last = None
    for _ in range(200):
        wait_idle(page, LOAD_MS)
        now = page.evaluate(VIEW_JS)
        loading = now is not None and any(
            w[0] == "stProgress" and str(w[1]).startswith("Loading ") for w in now
        )  # the model is loading: the page draws more once it is there
        if now is not None and now == last and not loading:
            return now
        last = now
    raise AssertionError(f"the view never settled: {last}")


def _widget(page: Page, kind: str, label: str):
    return page.locator(f'[data-testid="{kind}"]', has_text=label).first


def _open_list(page: Page, box) -> None:
    """Open a select box's list (a click swallowed by a rerun is tried again)."""
    for attempt in range(5):
        wait_idle(page, LOAD_MS)
        box.click()
        try:
            page.get_by_role("option").first.wait_for(timeout=5_000)
            return
        except PlaywrightTimeout:
            if attempt == 4:
                raise
            page.keyboard.press("Escape")


def _other_option(page: Page, label: str) -> None:
    """Pick, in the select box labelled ``label``, an option other than the one shown."""
    box = _widget(page, "stSelectbox", label).get_by_role("combobox")
    shown = box.input_value()
    _open_list(page, box)
    options = page.get_by_role("option")
    next(o for o in options.all() if o.inner_text().strip() != shown).click()
    _view(page)


def _tab(page: Page, name: str) -> None:
    """Show the tab ``name`` (the Benchmark opens on the loaded set's card; its other
    tabs' widgets are in the page, hidden, until their tab is shown)."""
    wait_idle(page, LOAD_MS)
    page.get_by_role("tab", name=name).click()
    expect(page.get_by_role("tab", name=name)).to_have_attribute("aria-selected", "true")


def _add_option(page: Page, label: str) -> None:
    """Add the first option not yet picked to the multiselect labelled ``label``."""
    _open_list(page, _widget(page, "stMultiSelect", label).get_by_role("combobox"))
    page.get_by_role("option").first.click()
    page.keyboard.press("Escape")
    _view(page)


def _radio(page: Page, label: str) -> None:
    """Click the second option of the radio labelled ``label``."""
    wait_idle(page, LOAD_MS)
    _widget(page, "stRadio", label).locator('[role="radiogroup"] label').nth(1).click()
    _view(page)


def _number(page: Page, label: str, value: int) -> None:
    wait_idle(page, LOAD_MS)
    box = _widget(page, "stNumberInput", label).locator("input")
    box.fill(str(value))
    box.press("Enter")
    _view(page)


def _check(page: Page, label: str) -> None:
    wait_idle(page, LOAD_MS)
    _widget(page, "stCheckbox", label).locator("label").click()
    _view(page)


def _sign_in_to_review(page: Page) -> None:
    page.get_by_test_id("stTextInputField").fill("Ada")
    page.get_by_role("button", name="Start reviewing").click()
    _widget(page, "stSelectbox", "Dataset").wait_for(timeout=LOAD_MS)


def _learn_step(page: Page) -> None:
    _radio(page, "Walkthrough")
    page.get_by_role("button", name="Next").click()
    page.get_by_text(re.compile(r"^Step 2 of")).wait_for(timeout=LOAD_MS)
    _view(page)


# Each page (its URL path and title), what a visitor changes on it before copying the link,
# and what a fresh browser must do before the view shows (Review asks for a name first).
COPY_LINKS: list[tuple[str, str, Callable[[Page], object], Callable[[Page], object] | None]] = [
    ("", "ragscope", lambda p: _radio(p, "Examples for the Playground"), None),
    ("playground", "Playground", lambda p: _other_option(p, "Example from"), None),
    ("token_heatmaps", "Token heatmaps", lambda p: _other_option(p, "Example"), None),
    ("counterfactual", "Counterfactual context", lambda p: _other_option(p, "Example"), None),
    ("mitigation", "Mitigation", lambda p: (_other_option(p, "Example"), _radio(p, "Method")), None),
    ("heads", "Heads & layers", lambda p: (_number(p, "Top copying heads", 5), _radio(p, "Count")), None),
    ("shap_summary", "SHAP summary", lambda p: _number(p, "At most", 6), None),
    ("token_sources", "Token sources", lambda p: (_other_option(p, "Example"), _check(p, "Aggregate by part of speech")), None),
    ("gam", "GAM shape functions", lambda p: (_other_option(p, "Feature"), _other_option(p, "Example")), None),
    ("feature_explanations", "Feature explanations", lambda p: _number(p, "At most", 24), None),
    # The tab shown is not part of the link: the visitor shows the runs' tab both times.
    ("benchmark", "Benchmark", lambda p: (_tab(p, "Held-out test runs"), _add_option(p, "Saved runs")), lambda p: _tab(p, "Held-out test runs")),
    ("agreement", "Agreement between detectors", lambda p: (_number(p, "Answers", 5), _other_option(p, "Dataset")), None),
    ("review", "Review flagged spans", lambda p: (_sign_in_to_review(p), _other_option(p, "Dataset")), _sign_in_to_review),
    ("learn", "Learn", _learn_step, None),
]  # fmt: skip


@pytest.mark.parametrize("path,title,change,enter", COPY_LINKS, ids=[c[1] for c in COPY_LINKS])
def test_a_link_copied_from_each_page_reopens_the_view_in_a_fresh_browser(
    app_url: str, chromium, path: str, title: str, change, enter
) -> None:
    """A visitor changes the view, copies the address bar, and someone else opens it in a
    fresh browser (a context of its own: no cookies, no session): the same headings, and
    every widget with the same value."""
    mine_ctx = chromium.new_context(viewport={"width": 1400, "height": 1000})
    theirs_ctx = chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        mine = mine_ctx.new_page()
        mine.goto(f"{app_url}/{path}")
        mine.get_by_role("heading", name=title).first.wait_for(timeout=LOAD_MS)
        loading = mine.locator('[data-testid="stProgress"]', has_text="Loading")
        expect(loading).to_have_count(0, timeout=LOAD_MS)  # the model, once per server
        before = _view(mine)
        change(mine)
        shown = _view(mine)
        assert shown != before, f"{title}: the change did not change the view"
        link = mine.url
        theirs = theirs_ctx.new_page()
        theirs.goto(link)
        theirs.get_by_role("heading", name=title).first.wait_for(timeout=LOAD_MS)
        if enter is not None:
            enter(theirs)
        opened = _view(theirs)
        if opened != shown:  # both views and screenshots, to see what differs
            name = path or "home"
            (LOG.parent / f"link-{name}.json").write_text(json.dumps([shown, opened], indent=1))
            mine.screenshot(path=str(LOG.parent / f"link-{name}-mine.png"), full_page=True)
            theirs.screenshot(path=str(LOG.parent / f"link-{name}-theirs.png"), full_page=True)
        assert opened == shown, f"{title}: {link} shows another view"
        assert theirs.get_by_text("This link names").count() == 0
        assert theirs.url == link  # the view's address is the link itself
    finally:
        mine_ctx.close()
        theirs_ctx.close()
