"""Deep links in a real browser (Chromium), on the tiny model.

A link names the page (its URL path) and, in its query string, the view's choices:
opening one shows the same example, head or SAE feature, and changing a control
rewrites the URL. The server runs ``streamlit run app/main.py`` on the tiny model
with a raglens detector fitted here (on the demo examples, with the small test SAE),
so the GAM page has features to link to.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from core.data import builtin_examples
from core.detectors import make_detector
from core.extract import extract_features
from core.model import LoadedModel
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
    feats = extract_features(tiny_model, examples, [det]).features["raglens"]
    det.fit(list(feats), examples).save(out / "raglens")
    return out, det.importances()[2][0]


@pytest.fixture(scope="module")
def app_url(raglens_dir, tiny_sae, tmp_path_factory, launch_streamlit) -> Iterator[str]:
    env = {
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


def _selectbox(page, label: str):
    """The select box labelled exactly ``label`` ("Example" is not "Examples")."""
    return page.get_by_role("combobox", name=label, exact=True)


def test_deep_links_reopen_the_view_and_controls_rewrite_the_url(
    app_url: str, raglens_dir: tuple[Path, int], open_chromium
) -> None:
    feature = raglens_dir[1]
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        plots = page.locator(".js-plotly-plot")

        # Heads & layers on an example and a head.
        page.goto(f"{app_url}/heads?dataset=demo&example={EXAMPLE}&head=L1H2")
        page.get_by_role("heading", name="Heads & layers").wait_for(timeout=LOAD_MS)
        plots.filter(has_text="Attention of L1H2").wait_for(state="visible", timeout=LOAD_MS)
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
