"""Real-browser smoke test: the app on the embedded model, driven in Chromium.

Starts ``streamlit run app/main.py`` on a free port with ``RAGSCOPE_MODEL=embedded``,
opens Home and the Playground in headless Chromium (Playwright), analyses a built-in
example (with a synthetic ``nll`` detector artifact for the embedded model, so the
verdict table and the detector colouring show), opens the Benchmark on a synthetic
saved run (and, below it, a synthetic cross-validation and cross-domain matrix run),
computes the Heads & layers statistics on a few examples and shows one
answer through another head, explains a quick spad fit on the SHAP summary page and one
answer's seven token sources and SHAP waterfall on the Token sources page (on the tiny
model: the quick fit traces 20 answers), shows
the shipped RAGLens detector (and SAE) on the GAM shape functions page, steps through
the shipped CORTEX detector's flagged spans on the Token heatmaps page, explains an
SAE feature through a local fake OpenAI-compatible endpoint on the Feature
explanations page, supports a flagged claim in the passage and re-scores it on the
Counterfactual context page, regenerates an answer with token-level feedback on the
Mitigation page, compares the detectors on the Agreement page, scans a review queue
and accepts an item with the keyboard on the Review page, and saves full-page
screenshots to ``test-artifacts/``.

The server gets its own cache dir (``RAGSCOPE_CACHE_DIR``) whose ``models`` folder
links to the session's, so the embedded model is not dequantized again while the
saved evaluation runs it reads (``<cache>/runs``) are the test's own.

Chromium is the Debian package (``/usr/bin/chromium``). Without it the test is
skipped, except in CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import threading
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

import numpy as np
import pytest
from playwright.sync_api import expect

from core.base.examples import Provenance, RAGExample, Span
from core.detectors import make_detector
from core.evaluation.crossval import CVOptions, cross_validate
from core.evaluation.cv_run import CVRun
from core.evaluation.evaluate import DetectorResult, EvalRun
from core.evaluation.matrix import MatrixRun
from core.learning.contract import Features
from core.learning.metrics import response_metrics
from core.pipeline.extract import Extraction
from tools.browser import full_page_screenshot, grow_to_content, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.embedded]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
MODEL_LOAD_MS = 240_000  # a cold cache dequantizes the embedded GGUF first
ANALYSE_MS = 120_000
EXAMPLE_ID = "demo-02-waggle-dance"  # has a gold hallucination span
CF_EXAMPLE_ID = "demo-04-mount-kelsey"  # one gold span, flagged by the shipped CORTEX
BENCH_RUN = "synthetic-browser-run"
_NOW = datetime.now(UTC).isoformat(timespec="seconds")
"""When the synthetic runs were made: the Benchmark's tabs open on the newest run."""
CV_RUN = "synthetic-browser-cv"
MATRIX_RUN = "synthetic-browser-matrix"
CV_DATASETS = ("synthetic-qa", "synthetic-summary")
CV_GENERATORS = ("model-a", "model-b", "model-c")
MATRIX_DATASETS = ("synthetic-qa", "synthetic-summary", "synthetic-data2txt")
SCREENSHOTS = REPO / "assets" / "screenshots"
EMBEDDED_KEY = "SmolLM2-135M-Instruct|L30xH9/KV3|D576|V49152|float32"
PAGES = [
    "Home",
    "Playground",
    "Token heatmaps",
    "Counterfactual context",
    "Mitigation",
    "Heads & layers",
    "SHAP summary",
    "Token sources",
    "GAM shape functions",
    "Feature explanations",
    "Benchmark",
    "Agreement",
    "Review",
    "Learn",
]
SECTIONS = ["Analyse", "Detectors", "Evaluate", "Annotate", "Learn"]
"""The sidebar's section headers, in order (Home stands first, under none)."""
HEADS_EXAMPLES = 6
SHAP_EXAMPLES = 4
EXPLAIN_EXAMPLES = 8
STATS_MS = 600_000  # a traced pass per example on a small CPU machine


def _synthetic_run(n: int = 60, seed: int = 0) -> EvalRun:
    """A saved run for the Benchmark: three detectors with seeded scores of some skill."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 2)
    results = []
    for k, (det, skill) in enumerate((("nll", 0.2), ("context_gain", 0.3), ("lexical", 0.1))):
        s = np.clip(0.4 + skill * y + rng.normal(0, 0.17, n), 0, 1).round(4)
        t = 0.5
        results.append(
            DetectorResult(
                detector=det,
                config_hash=f"cfg{k}",
                threshold=t,
                metrics=response_metrics(y, s, t, n_boot=200),
                token_metrics=None,
                validation_metrics=None,
                scores=tuple(float(v) for v in s),
            )
        )
    return EvalRun(
        name=BENCH_RUN,
        created_at=_NOW,  # the newest run: the tab opens on it (before the shipped ones)
        model="SmolLM2-135M-Instruct|L30xH9/KV3|D576|V49152|float32",
        train_dataset="synthetic",
        test_dataset="synthetic",
        data_hashes={"train": "aaaa1111", "validation": "bbbb2222", "test": "cccc3333"},
        split_sizes={"train": 280, "validation": 60, "test": n},
        test_ids=tuple(f"t{i}" for i in range(n)),
        test_labels=tuple(int(v) for v in y),
        test_tasks=tuple(("qa", "summary", "data2txt")[i % 3] for i in range(n)),
        test_generators=tuple(("gen-a", "gen-b")[i % 2] for i in range(n)),
        results=tuple(results),
        extraction={
            "computed": 400,
            "cache_hits": 0,
            "seconds": 95.0,
            "examples_per_minute": 252.6,
        },
    )


def _synthetic_cv_run(n_sources: int = 60, n_tokens: int = 12, seed: int = 0) -> CVRun:
    """A 5-fold cross-validation of nll, context_gain and lexical by the real
    :func:`core.evaluation.crossval.cross_validate`, on seeded features of some skill instead of
    the model's: two datasets (summaries are harder), three generators answering every
    question (later ones hallucinate more), gold spans on four tokens."""
    rng = np.random.default_rng(seed)
    offsets = np.stack([np.arange(n_tokens), np.arange(1, n_tokens + 1)], axis=1)
    span = slice(4, 8)
    examples: list[RAGExample] = []
    feats: dict[str, list[Features]] = {"nll": [], "context_gain": [], "lexical": []}
    for j in range(n_sources):
        dataset = CV_DATASETS[j * len(CV_DATASETS) // n_sources]
        skill = 0.9 if dataset == CV_DATASETS[0] else 0.45
        for k, gen in enumerate(CV_GENERATORS):
            y = bool(rng.random() < 0.25 + 0.15 * k)
            hall = np.zeros(n_tokens, dtype=bool)
            hall[span] = y
            s = rng.gamma(2.0, 1.5, n_tokens) + 2.5 * skill * hall
            gain = rng.normal(0.8, 1.0, n_tokens) - 1.6 * skill * hall
            absent = (rng.random(n_tokens) < 0.15 + 0.5 * skill * hall).astype(float)
            eid = f"{dataset}-{j}-{gen}"
            for det, names, response, tokens in (
                (
                    "nll",
                    ("surprisal_mean", "surprisal_max", "surprisal_p90"),
                    [s.mean(), s.max(), np.percentile(s, 90)],
                    s,
                ),
                (
                    "context_gain",
                    ("gain_mean", "gain_min", "gain_p10", "share_negative_gain"),
                    [gain.mean(), gain.min(), np.percentile(gain, 10), (gain < 0).mean()],
                    gain,
                ),
                (
                    "lexical",
                    ("share_absent", "n_absent", "n_content"),
                    [absent.mean(), absent.sum(), float(n_tokens)],
                    absent,
                ),
            ):
                feats[det].append(
                    Features(
                        detector=det,
                        example_id=eid,
                        model=EMBEDDED_KEY,
                        names=names,
                        response=np.asarray(response, dtype=np.float64),
                        token_names=(names[0],),
                        tokens=np.asarray(tokens, dtype=np.float64)[:, None],
                        token_offsets=offsets,
                    )
                )
            examples.append(
                RAGExample(
                    id=eid,
                    task="qa" if dataset == CV_DATASETS[0] else "summary",
                    question=f"Question {j}?",
                    passages=(f"Passage {j}.",),
                    response="x" * n_tokens,
                    label=y,
                    spans=(Span(start=span.start, end=span.stop),) if y else (),
                    provenance=Provenance(dataset=dataset, generator=gen),
                )
            )
    extraction = Extraction(
        examples=tuple(examples),
        features={k: tuple(v) for k, v in feats.items()},
        errors=(),
        cache_hits=len(examples),
        computed=0,
        seconds=0.0,
    )
    # Features given: cross_validate reads only the model's key (for the run's record).
    model = types.SimpleNamespace(info=types.SimpleNamespace(key=EMBEDDED_KEY))
    return cross_validate(
        model,  # type: ignore[arg-type]
        list(feats),
        examples,
        # the page is under test; cross-fitting is tested in unit tests
        CVOptions(k=5, n_boot=200, name=CV_RUN, calibration="split"),
        datasets=CV_DATASETS,
        extraction=extraction,
    )


def _synthetic_matrix_run(seed: int = 0) -> MatrixRun:
    """A cross-domain matrix of seeded cells: within a dataset (the diagonal) a detector
    does best, on another dataset worse, trained on all the others in between."""
    rng = np.random.default_rng(seed)
    cells: dict[str, dict[str, dict[str, dict[str, object]]]] = {}
    for d, det in enumerate(("nll", "context_gain", "lexical")):
        by_train: dict[str, dict[str, dict[str, object]]] = {}
        trainings = [(t, list(MATRIX_DATASETS)) for t in MATRIX_DATASETS]
        trainings += [(f"all but {t}", [t]) for t in MATRIX_DATASETS]
        for train, tests in trainings:
            for test in tests:
                base = 0.78 if train == test else 0.68 if train.startswith("all but") else 0.6
                auroc = float(np.clip(base - 0.04 * d + rng.normal(0, 0.03), 0.4, 0.95))
                ap = float(np.clip(auroc - 0.12 + rng.normal(0, 0.02), 0.2, 0.95))
                half = 0.05 + 0.02 * rng.random()
                by_train.setdefault(train, {})[test] = {
                    "n": 120,
                    "n_positive": 44,
                    "auroc": auroc,
                    "auroc_ci": [auroc - half, min(auroc + half, 1.0)],
                    "ap": ap,
                    "ap_ci": [ap - half - 0.02, min(ap + half + 0.02, 1.0)],
                    "balanced_accuracy": float(np.clip(auroc - 0.08, 0.4, 0.95)),
                }
        cells[det] = by_train
    return MatrixRun(
        name=MATRIX_RUN,
        created_at=_NOW,  # the newest run: the tab opens on it (before the shipped ones)
        model=EMBEDDED_KEY,
        datasets=MATRIX_DATASETS,
        k=5,
        seed=0,
        cells=cells,
    )


def _synthetic_detectors(folder: Path, n: int = 40, n_tokens: int = 12) -> Path:
    """An ``nll`` artifact for the embedded model, fitted on seeded surprisal values.

    Real enough to load and run on the embedded model (it reads only the logits), cheap
    enough to make without loading it; the Playground is checked for the verdict table
    and the detector colouring, not for the detector's skill.
    """
    rng = np.random.default_rng(0)
    features, examples = [], []
    offsets = np.stack([np.arange(n_tokens), np.arange(1, n_tokens + 1)], axis=1)
    for i in range(n):
        y = i % 2
        s = rng.gamma(2.0, 1.5 + 1.5 * y, n_tokens)  # bits; hallucinated answers run higher
        features.append(
            Features(
                detector="nll",
                example_id=f"s{i}",
                model=EMBEDDED_KEY,
                names=("surprisal_mean", "surprisal_max", "surprisal_p90"),
                response=np.asarray([s.mean(), s.max(), np.percentile(s, 90)]),
                token_names=("surprisal",),
                tokens=s[:, None],
                token_offsets=offsets,
            )
        )
        examples.append(
            RAGExample(
                id=f"s{i}", question="Q?", passages=("P.",), response="x" * n_tokens, label=bool(y)
            )
        )
    # The shipped RAGLens detector (it reads the shipped SAE) for the GAM page, and the
    # CORTEX of the built-in set for the pages that follow its token flags (Token
    # heatmaps, Mitigation, Review): trained on template answers like the demo's, it
    # flags the demo's gold spans; the default set's, trained on RAGTruth, stays under
    # its token threshold on them.
    shutil.copytree(REPO / "assets" / "detectors" / "raglens", folder / "raglens")
    shutil.copytree(REPO / "assets" / "detector-sets" / "builtin" / "cortex", folder / "cortex")
    det = make_detector("nll").fit(features, examples)
    det.save(
        folder / "nll",
        extra={
            "trained_on": {"dataset": "synthetic", "n": {"train": n}},
            "metrics": {"test": {"auroc": 0.75}},
        },
    )
    return folder


def _server_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir of the server's own (a synthetic saved run of each kind: train / test,
    cross-validation, cross-domain matrix) sharing the model cache."""
    shared = Path(os.environ["RAGSCOPE_CACHE_DIR"]).expanduser() / "models"
    shared.mkdir(parents=True, exist_ok=True)
    cache = tmp_path_factory.mktemp("browser-cache")
    (cache / "models").symlink_to(shared, target_is_directory=True)
    _synthetic_run().save(cache / "runs")
    _synthetic_cv_run().save(cache / "runs")
    _synthetic_matrix_run().save(cache / "runs")
    return cache


FAKE_EXPLANATION = (
    "Description: fires on dates and numbers the answer states.\n"
    "Hallucination: unclear - numbers can be copied or invented."
)


class _FakeLLM(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint on localhost that answers every request with
    :data:`FAKE_EXPLANATION` and records what it was asked (the class's ``asked``)."""

    asked: ClassVar[list[dict]] = []

    def do_POST(self) -> None:  # noqa: N802 (the handler's API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).asked.append({"path": self.path, **body})
        reply = json.dumps(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "fake"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": FAKE_EXPLANATION},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[str]:
    """The base URL (``.../v1``) of a local fake explainer (see :class:`_FakeLLM`)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeLLM)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()


def _server_env(tmp_path_factory: pytest.TempPathFactory, model: str) -> dict[str, str]:
    """A server's model (on the CPU) and its own cache dir, database and synthetic
    detectors."""
    return {
        "RAGSCOPE_MODEL": model,
        "RAGSCOPE_DEVICE": "cpu",
        "RAGSCOPE_CACHE_DIR": str(_server_cache_dir(tmp_path_factory)),
        "RAGSCOPE_DB": str(tmp_path_factory.mktemp(f"browser-{model}-db") / "ragscope.sqlite3"),
        "RAGSCOPE_DETECTORS_DIR": str(
            _synthetic_detectors(tmp_path_factory.mktemp(f"browser-{model}-detectors"))
        ),
    }


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, fake_llm: str, launch_streamlit
) -> Iterator[str]:
    """A running ``streamlit run app/main.py`` on the embedded model; yields its URL."""
    ARTIFACTS.mkdir(exist_ok=True)
    env = {
        **_server_env(tmp_path_factory, "embedded"),
        "RAGSCOPE_LLM_BASE_URL": fake_llm,
        "RAGSCOPE_LLM_MODEL": "fake-explainer",
        "RAGSCOPE_LLM_API_KEY": "test-key",
    }
    with launch_streamlit(env, ARTIFACTS / "streamlit-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory, launch_streamlit) -> Iterator[str]:
    """The app on the tiny random model (the same synthetic detectors and runs): for the
    SPAD pages, whose quick fit traces 20 answers of the built-in corpus, each probed at
    every point of the residual stream (a minute or two on the embedded model; what the
    test checks is the pages, not the model)."""
    env = _server_env(tmp_path_factory, "tiny")
    with launch_streamlit(env, ARTIFACTS / "streamlit-tiny-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser(server: str, open_chromium) -> Iterator[object]:
    """Headless Debian Chromium through Playwright."""
    with open_chromium() as b:
        yield b


def _wait_for_plots(
    plots: object, titles: tuple[str, ...], *, timeout: int, min_height: int
) -> None:
    """Wait until each plotly figure titled ``titles[i]`` is visible and at least that tall."""
    for title in titles:
        plot = plots.filter(has_text=title)  # type: ignore[attr-defined]
        plot.wait_for(state="visible", timeout=timeout)
        assert plot.bounding_box()["height"] > min_height


def _assert_no_exception(page: object) -> None:
    boxes = page.locator('[data-testid="stException"]')  # type: ignore[attr-defined]
    assert boxes.count() == 0, boxes.first.inner_text()


def _sidebar_pages(page: object) -> list[str]:
    """The sidebar's page names (the last line of each link: icons come first)."""
    links = page.locator('[data-testid="stSidebarNav"] a')  # type: ignore[attr-defined]
    return [t.strip().splitlines()[-1] for t in links.all_inner_texts()]


def _sidebar_sections(page: object) -> list[str]:
    """The sidebar's section headers."""
    heads = page.locator('[data-testid="stNavSectionHeader"]')  # type: ignore[attr-defined]
    return [t.strip() for t in heads.all_inner_texts()]


@contextmanager
def _opened(browser: object, server: str, path: str, heading: str) -> Iterator[object]:
    """A new 1440 x 1000 page at ``server/path``, once its ``heading`` shows (the model
    may load first) and the sidebar lists every page; closed when the block ends. Every
    request the page makes meanwhile must go to the app itself: nothing leaves the
    machine (no fonts, icons or scripts from a third party)."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})  # type: ignore[attr-defined]
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url))
    try:
        page.goto(f"{server}/{path}", wait_until="domcontentloaded")
        page.get_by_role("heading", name=heading).wait_for(timeout=MODEL_LOAD_MS)
        assert _sidebar_pages(page) == PAGES
        assert [t.title() for t in _sidebar_sections(page)] == SECTIONS
        yield page
    finally:
        page.close()
    assert fetched, "no request was recorded: the request hook is not listening"
    assert not (foreign := _foreign(fetched, server)), f"{path} asked other hosts: {foreign}"


def _foreign(urls: Sequence[str], server: str) -> list[str]:
    """The URLs of ``urls`` that leave the app: another host or port than ``server``'s
    (in-page ``data:``/``blob:``/``about:`` ones stay)."""
    own = urlsplit(server).netloc
    return [
        u
        for u in urls
        if not u.startswith(("data:", "blob:", "about:")) and urlsplit(u).netloc != own
    ]


def test_playground_and_home_in_chromium(server: str, browser: object) -> None:
    # A fresh server, visited straight at /playground: the app's navigation (not a
    # pages-folder fallback) must run, and the (possibly cold) model must load.
    with _opened(browser, server, "playground", "Playground") as page:
        page.get_by_text("SmolLM2-135M-Instruct").first.wait_for()  # sidebar model status

        # Pick a built-in example with a gold span, paste mode, analyse.
        page.locator('[data-testid="stSelectbox"]').first.click()
        page.get_by_role("option", name=re.compile(re.escape(EXAMPLE_ID))).click()
        page.get_by_text(re.compile("duration of a honeybee")).first.wait_for()
        page.get_by_text("Paste an answer", exact=True).click()
        answer = page.get_by_label("Answer to analyse")
        # The old example's text area stays in the DOM until the rerun reaches it, so
        # wait for the value rather than reading it once.
        expect(answer).to_have_value(re.compile(r"^The duration of the waggle run"))
        page.get_by_role("button", name=re.compile("Analyse")).click()

        heatmap = page.locator(".rs-heatmap")
        heatmap.wait_for(state="visible", timeout=ANALYSE_MS)
        assert heatmap.is_visible()
        assert page.locator(".rs-heatmap .rs-tok").count() > 10
        assert page.locator(".rs-heatmap .rs-gold").count() > 0
        page.locator(".js-plotly-plot").first.wait_for(state="visible")
        page.get_by_text("Mean surprisal").wait_for()

        # The shipped (here: synthetic) detector judges the answer: a verdict table, and
        # its token scores as the heatmap's colouring.
        page.get_by_role("heading", name="Detector verdicts").wait_for()
        assert page.get_by_text("No trained detectors").count() == 0, "the artifact was not used"
        # One verdict line, then a static table: every detector's row in view.
        page.get_by_text(re.compile(r"^(Hallucinated|Faithful): .*flag")).first.wait_for()
        verdicts = page.locator('[data-testid="stTable"]').first
        verdicts.wait_for(state="visible")
        assert verdicts.bounding_box()["height"] > 40  # type: ignore[index]
        assert verdicts.locator("tbody tr").count() == 3  # raglens, cortex, nll
        page.get_by_text(re.compile("gives a score from 0 to 1")).wait_for()
        page.get_by_text("nll token score", exact=True).first.click()
        legend = page.locator(".rs-heatmap-wrap .rs-legend", has_text="nll token score")
        legend.wait_for(state="visible")
        assert page.locator(".rs-heatmap .rs-gold").count() > 0
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "playground.png")

        # Home through the sidebar navigation: model status and dataset picker.
        page.locator('[data-testid="stSidebarNav"] a', has_text="Home").click()
        page.get_by_text("Layers × heads").wait_for()
        page.get_by_text("Built-in demo examples").first.wait_for()
        assert page.get_by_text("30 × 9").is_visible()
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "home.png")


def test_benchmark_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "benchmark", "Benchmark") as page:
        # It opens on the loaded set's card; older runs are one click away.
        tabs = page.get_by_role("tab")
        expect(tabs.first).to_have_text("Loaded set")
        page.get_by_role("tab", name="Held-out test runs").click()
        # The synthetic run is picked (newest first) and its metric table is drawn.
        page.get_by_text(re.compile(re.escape(BENCH_RUN))).first.wait_for()
        page.get_by_role("heading", name="Test metrics").wait_for()
        # The loaded set's tab, now hidden, draws tables and charts of its own first.
        table = page.locator('[data-testid="stDataFrame"]:visible').first
        table.wait_for(state="visible")
        assert table.bounding_box()["height"] > 80  # type: ignore[index]

        # ROC curves with AUROC in the legend, and the confusion matrix.
        roc = page.locator(".js-plotly-plot:visible").first
        legend = roc.locator(".legendtext", has_text="AUROC")
        legend.first.wait_for(state="visible")
        assert legend.count() == 3
        page.get_by_text(re.compile(r"At threshold 0\.500: TP \d+")).wait_for()
        # One tab per kind of run: the test runs' five charts show, the others wait.
        assert [t.inner_text().strip() for t in tabs.all()] == [
            "Loaded set",
            "Held-out test runs",
            "Cross-validation",
            "Cross-domain matrix",
            "Review learning curves",
        ]
        visible = page.locator(".js-plotly-plot:visible")
        expect(visible).to_have_count(5, timeout=60_000)
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "benchmark.png")


def _section_screenshot(
    page: object, top: object, path: Path, *, until: object | None = None, through: object = None
) -> None:
    """Screenshot the main column from the ``top`` element down to the ``until`` one
    (exclusive), or through the ``through`` one, with the viewport grown to the whole
    page as in :func:`tools.browser.full_page_screenshot` so every chart has been drawn."""
    size = grow_to_content(page)  # type: ignore[arg-type]
    column = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()  # type: ignore[attr-defined]
    y0 = top.bounding_box()["y"] - 16  # type: ignore[attr-defined]
    if until is not None:
        y1 = until.bounding_box()["y"] - 24  # type: ignore[attr-defined]
    else:
        box = through.bounding_box()  # type: ignore[attr-defined]
        y1 = box["y"] + box["height"] + 24
    page.screenshot(  # type: ignore[attr-defined]
        path=str(path),
        # 2 px in from the left: the sidebar's border runs along the column's edge.
        clip={"x": column["x"] + 2, "y": y0, "width": column["width"] - 2, "height": y1 - y0},
    )
    page.set_viewport_size(size)  # type: ignore[attr-defined]


def test_benchmark_cross_validation_and_matrix_in_chromium(server: str, browser: object) -> None:
    # The tab opens on the loaded set's own run; a link names the synthetic one.
    with _opened(browser, server, f"benchmark?cv={CV_RUN}", "Benchmark") as page:
        page.get_by_role("tab", name="Cross-validation").click()
        cv_head = page.get_by_role("heading", name="Cross-validation", exact=True)
        matrix_head = page.get_by_role("heading", name="Cross-domain matrix", exact=True)
        cv_head.wait_for()
        page.get_by_text(re.compile(re.escape(CV_RUN))).first.wait_for()
        page.get_by_text(re.compile(r"5-fold source-grouped cross-validation on")).wait_for()
        plots = page.locator(".js-plotly-plot")
        _wait_for_plots(
            plots,
            ("AUROC of each fold and pooled", "Reliability of the calibrated out-of-fold scores"),
            timeout=60_000,
            min_height=250,
        )
        spread = plots.filter(has_text="AUROC of each fold and pooled")
        # Every detector's row: 5 fold circles each and a pooled diamond.
        assert spread.locator(".scatterlayer .point").count() == 3 * 5 + 3
        reliability = plots.filter(has_text="Reliability of the calibrated")
        assert reliability.locator(".legendtext", has_text="(ECE ").count() == 3
        _assert_no_exception(page)
        _section_screenshot(page, cv_head, ARTIFACTS / "benchmark_cv.png", through=reliability)
        page.get_by_role("tab", name="Cross-domain matrix").click()
        _wait_for_plots(plots, ("AUROC of nll: trained on",), timeout=60_000, min_height=250)
        heat = plots.filter(has_text="AUROC of nll: trained on")
        # Rows: three datasets, then "all but" each; the "all but" rows test one set only.
        for label in (*MATRIX_DATASETS, "all but synthetic-qa"):
            assert heat.locator(".ytick", has_text=label).count() >= 1
        run = _synthetic_matrix_run()
        diag = run.cells["nll"]["synthetic-qa"]["synthetic-qa"]["auroc"]
        heat.get_by_text(f"{diag:.3f}", exact=True).wait_for()
        _assert_no_exception(page)
        matrix_csv = page.get_by_role("button", name=re.compile(r"Every cell of every detector"))
        _section_screenshot(
            page, matrix_head, ARTIFACTS / "benchmark_matrix.png", through=matrix_csv
        )


def test_heads_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "heads", "Heads & layers") as page:
        # Copying heads of all 30 x 9 heads, and the one-answer view of the top head
        # (traced on first show, before any statistics).
        plots = page.locator(".js-plotly-plot")
        plots.filter(has_text="Copying score per head").wait_for(state="visible")
        attention = plots.filter(has_text="Attention of L")
        attention.wait_for(state="visible", timeout=ANALYSE_MS)
        page.locator(".rs-heatmap .rs-tok").first.wait_for(state="visible")
        assert page.locator(".rs-heatmap .rs-gold").count() > 0
        page.get_by_text(re.compile("No trained redeep_token detector")).wait_for()

        # Statistics on a few built-in examples, with progress.
        limit = page.get_by_role("spinbutton", name="At most")
        limit.fill(str(HEADS_EXAMPLES))
        limit.press("Enter")
        page.get_by_text(re.compile(rf"^{HEADS_EXAMPLES} of the \d+ examples")).wait_for()
        page.get_by_role("button", name=re.compile("Compute statistics")).click()
        summary = re.compile(rf"hallucinated answers from {HEADS_EXAMPLES} examples")
        page.get_by_text(summary).wait_for(timeout=STATS_MS)
        for title in (
            "Mean ECS, faithful answers",
            "Mean ECS, hallucinated answers",
            "Mean ECS, faithful − hallucinated",
            "Pearson r of ECS",
            "PKS per layer",
        ):
            plot = plots.filter(has_text=title)
            plot.wait_for(state="visible")
            assert plot.bounding_box()["height"] > 200  # type: ignore[index]
        assert plots.count() == 7

        # Another layer redraws the attention without a new trace of the answer.
        # The option list is virtualised: type to filter it rather than scroll to L20.
        page.locator('[data-testid="stSelectbox"]', has_text="Layer").click()
        page.keyboard.type("L20")
        page.get_by_role("option", name="L20", exact=True).click()
        plots.filter(has_text="Attention of L20H").wait_for(state="visible")
        # The previous run's elements linger until the rerun replaces them: wait until
        # exactly one chunk table heading is left.
        expect(page.get_by_role("heading", name="Chunks")).to_have_count(1, timeout=60_000)
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "heads.png")

        # Context attribution (the set's first span, else the answer's first sentence),
        # then the ablation check, in plain words.
        heading = page.get_by_role("heading", name="Context attribution")
        heading.wait_for()
        page.get_by_text(re.compile(r"of these tokens' attention \(all heads\) went to")).wait_for()
        page.get_by_text(re.compile(r"^Passage \d+, its most attended sentences")).first.wait_for()
        page.get_by_role("button", name="Check it: remove the top sentence").click()
        result = page.get_by_text(
            re.compile(r"Removing the most attended sentence \(passage \d+\)")
        )
        result.wait_for(timeout=ANALYSE_MS)
        _assert_no_exception(page)
        _section_screenshot(page, heading, ARTIFACTS / "context_attribution.png", through=result)


def test_spad_pages_in_chromium(tiny_server: str, browser: object) -> None:
    with _opened(browser, tiny_server, "shap_summary", "SHAP summary") as page:
        # No spad artifact for the embedded model here: the command is named.
        page.get_by_text(re.compile("No trained spad detector")).wait_for()

        # A few test-split answers of the built-in corpus, features with progress.
        page.locator('[data-testid="stSelectbox"]', has_text="Examples").click()
        page.get_by_role("option", name="Built-in labelled corpus").click()
        # The split defaults to test (the selectbox's value is not in its text).
        page.get_by_text(re.compile(r"examples \(test\) of Built-in labelled corpus")).wait_for()
        limit = page.get_by_role("spinbutton", name="At most")
        limit.fill(str(SHAP_EXAMPLES))
        limit.press("Enter")
        page.get_by_text(re.compile(rf"^{SHAP_EXAMPLES} of the \d+ examples \(test\)")).wait_for()
        # the rerun redraws the compute row: until it ends, a stale copy can stand beside it
        wait_idle(page, ANALYSE_MS)
        page.get_by_role("button", name=re.compile("Compute SHAP values")).click()
        page.get_by_text(
            re.compile(rf"spad features of {SHAP_EXAMPLES} answers are ready")
        ).wait_for(timeout=STATS_MS)

        # The quick fit (train split), then the beeswarm, the bars and the grid.
        page.get_by_role("button", name=re.compile("Quick fit")).click()
        plots = page.locator(".js-plotly-plot")
        _wait_for_plots(
            plots,
            (
                "SHAP values of the top",
                "Mean |SHAP| of the top",
                "Mean SHAP value by source and part of speech",
            ),
            timeout=STATS_MS,
            min_height=250,
        )
        page.get_by_text(re.compile(r"not a trained detector")).first.wait_for()
        assert plots.filter(has_text="SHAP values of the top").locator(".point").count() > 0
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "shap.png")

        # Token sources through the sidebar (same session: the quick fit stays).
        page.locator('[data-testid="stSidebarNav"] a', has_text="Token sources").click()
        page.get_by_role("heading", name="Token sources").wait_for()
        bars = plots.filter(has_text="Seven sources of each answer token")
        bars.wait_for(state="visible", timeout=ANALYSE_MS)
        assert bars.bounding_box()["height"] > 300  # type: ignore[index]
        assert bars.locator(".legendtext", has_text="gold hallucination span").count() == 1
        waterfall = plots.filter(has_text="SHAP waterfall of")
        waterfall.wait_for(state="visible", timeout=ANALYSE_MS)
        page.get_by_text(
            re.compile(r"gives this answer a (raw )?(score|probability) of")
        ).wait_for()
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "token_sources.png")

        # Aggregated by part of speech: the per-tag means replace the per-token bars.
        page.get_by_text("Aggregate by part of speech").click()
        plots.filter(has_text="Mean of the seven sources per part of speech").wait_for(
            state="visible"
        )
        # The old chart leaves the DOM when the rerun finishes: expect() waits for that.
        expect(plots.filter(has_text="Seven sources of each answer token")).to_have_count(0)
        _assert_no_exception(page)


def test_gam_page_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "gam", "GAM shape functions") as page:
        page.get_by_text("Variance explained").wait_for()  # the shipped SAE's quality
        page.get_by_text(re.compile(r"Shipped raglens detector")).first.wait_for()
        plots = page.locator(".js-plotly-plot")
        _wait_for_plots(
            plots,
            (
                "EBM importance of the top",
                "Shape function of SAE feature",
                "Largest contributions to this answer",
            ),
            timeout=ANALYSE_MS,
            min_height=200,
        )
        page.get_by_text(re.compile(r"RAGLens score")).first.wait_for()
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "gam.png")


def test_token_heatmaps_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "token_heatmaps", "Token heatmaps") as page:
        page.locator('[data-testid="stSelectbox"]', has_text="Example").click()
        page.get_by_role("option", name=re.compile(EXAMPLE_ID)).click()
        heat = page.locator(".rs-mr")
        heat.wait_for(state="visible", timeout=ANALYSE_MS)
        # The rows the page reads: gold, CORTEX raw and smoothed, the nll detector, the
        # top RAGLens features and the surprisal, each under every token.
        names = set(heat.locator("td.rs-mr-name").all_inner_texts())
        assert {"gold span", "CORTEX raw", "CORTEX smoothed", "nll", "surprisal (bits)"} <= names
        assert any(n.startswith("RAGLens F") for n in names)
        n_tok = heat.locator("td.rs-mr-tok").count()
        assert n_tok > 10
        assert heat.locator("td.rs-mr-cell").count() == n_tok * len(
            heat.locator("table").first.locator("tr").all()[1:]
        )
        page.get_by_text(re.compile(r"CORTEX answer probability")).wait_for()
        # Flag with a low threshold and jump to the first predicted span.
        page.get_by_role("button", name=re.compile("Next")).click()
        page.get_by_text(re.compile(r"^Span 1 of \d+")).wait_for(timeout=ANALYSE_MS)
        # The heatmap is drawn after the span readout: wait for its rerun too.
        heat.locator("td.rs-mr-focus").first.wait_for(timeout=ANALYSE_MS)
        assert heat.locator("td.rs-mr-flag").count() > 0
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "token_heatmaps.png")


def test_feature_explanations_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "feature_explanations", "Feature explanations") as page:
        page.get_by_text(re.compile(r"Explainer: fake-explainer at")).wait_for()
        limit = page.get_by_role("spinbutton", name="At most")
        limit.fill(str(EXPLAIN_EXAMPLES))
        limit.press("Enter")
        page.get_by_text(re.compile(rf"^{EXPLAIN_EXAMPLES} of the \d+ examples")).wait_for()
        page.get_by_role("button", name=re.compile("Read activations")).click()
        # One card per feature the shipped raglens detector ranks first.
        page.get_by_role("heading", name=re.compile(r"^F\d+$")).first.wait_for(timeout=STATS_MS)
        n_asked = len(_FakeLLM.asked)
        page.get_by_role("button", name=re.compile(r"Explain$")).first.click()
        page.get_by_text(re.compile("fires on dates and numbers the answer states")).first.wait_for(
            timeout=ANALYSE_MS
        )
        page.get_by_text(re.compile(r"Related to hallucination: unclear")).first.wait_for()
        # The page asked the endpoint once, with the model named and the examples in the prompt.
        asked = _FakeLLM.asked[n_asked:]
        assert len(asked) == 1 and asked[0]["path"] == "/v1/chat/completions"
        assert asked[0]["model"] == "fake-explainer"
        assert [m["role"] for m in asked[0]["messages"]] == ["system", "user"]
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "feature_explanations.png")


def test_counterfactual_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "counterfactual", "Counterfactual context") as page:
        page.locator('[data-testid="stSelectbox"]', has_text="Example").click()
        page.get_by_role("option", name=re.compile(re.escape(CF_EXAMPLE_ID))).click()
        page.get_by_text(re.compile("Mount Kelsey")).first.wait_for()
        # The first example's passage boxes stay in the DOM until the rerun ends.
        passage = page.get_by_label("Passage 1")
        expect(passage).to_have_count(1, timeout=ANALYSE_MS)
        expect(passage).to_have_value(re.compile("^Mount Kelsey"), timeout=ANALYSE_MS)
        # Support the gold span's claim in the passage, then re-score both versions.
        page.get_by_role("button", name=re.compile("Support it")).click()
        expect(passage).to_have_value(
            re.compile("It was built by the national park service in 1974"), timeout=ANALYSE_MS
        )
        page.get_by_role("button", name=re.compile("Compare")).click()
        page.get_by_role("heading", name=re.compile(r"^Original vs edited")).wait_for(
            timeout=ANALYSE_MS
        )
        heat = page.locator(".rs-mr")
        heat.wait_for(state="visible", timeout=ANALYSE_MS)
        names = set(heat.locator("td.rs-mr-name").all_inner_texts())
        assert {"cortex: orig", "cortex: edited", "cortex: Δ"} <= names
        assert any(n.startswith("SAE F") for n in names)
        page.locator(".rs-diff ins").first.wait_for()  # the inserted claim
        page.get_by_text(re.compile(r"Context changes: passage \d+: inserted")).wait_for()
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "counterfactual.png")


def test_mitigation_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "mitigation", "Mitigation") as page:
        page.locator('[data-testid="stSelectbox"]', has_text="Example").click()
        page.get_by_role("option", name=re.compile(re.escape(CF_EXAMPLE_ID))).click()
        # Token-level feedback quoting what the shipped CORTEX flags, then a new answer.
        page.get_by_text(
            re.compile(
                r"Feedback turn sent \(token level, quoting \d+ flagged span\(s\)\): These parts"
            )
        ).wait_for(timeout=ANALYSE_MS)
        page.get_by_role("button", name=re.compile("Regenerate")).click()
        page.locator(".rs-answer-diff").wait_for(state="visible", timeout=ANALYSE_MS)
        table = page.locator('[data-testid="stDataFrame"]').first
        table.wait_for(state="visible")
        assert table.bounding_box()["height"] > 80  # type: ignore[index]
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "mitigation.png")


def test_agreement_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "agreement", "Agreement between detectors") as page:
        page.locator('[data-testid="stSelectbox"]', has_text="Dataset").click()
        page.get_by_role("option", name="Built-in labelled corpus").click()
        answers = page.get_by_label("Answers")
        answers.fill("6")
        answers.press("Enter")
        # The rerun with 6 answers has drawn its note: Compare now reads 6 (clicked before
        # it, Compare could run with the old number, e.g. under load).
        page.get_by_text(re.compile(r"verdicts on 6 answers")).wait_for(timeout=ANALYSE_MS)
        page.get_by_role("button", name=re.compile("Compare")).click()
        page.get_by_text(re.compile(r"^6 answers of")).wait_for(timeout=ANALYSE_MS)
        # correlation and gold matrix: wait until both are drawn (the second can come later)
        expect(page.locator(".js-plotly-plot")).to_have_count(2, timeout=ANALYSE_MS)
        page.get_by_text("Answers the detectors disagree on most").wait_for()
        page.get_by_role("button", name=re.compile("in Token heatmaps")).wait_for()
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "agreement.png")


def test_review_in_chromium(server: str, browser: object) -> None:
    # Review opens on Home's dataset (the quick demo here); this scans the corpus
    with _opened(browser, server, "review?dataset=builtin", "Review flagged spans") as page:
        page.get_by_label("Your name", exact=True).fill("ann")
        page.get_by_role("button", name="Start reviewing").click()
        page.get_by_text("Reviewing as").wait_for()
        page.locator('[data-testid="stSelectbox"]', has_text="Dataset").wait_for()
        scan = page.get_by_label("Answers to scan")
        scan.fill("4")
        scan.press("Enter")
        page.get_by_text(re.compile(r"^Scans the next 4 answers")).wait_for(timeout=ANALYSE_MS)
        # the rerun redraws the scan form: until it ends, a stale copy can stand beside it
        wait_idle(page, ANALYSE_MS)
        scan_button = page.get_by_role("button", name=re.compile("Scan and queue"))
        expect(scan_button).to_have_count(1, timeout=ANALYSE_MS)
        scan_button.click()
        page.get_by_text(re.compile(r"^Scanned 4 answers")).wait_for(timeout=ANALYSE_MS)
        header = page.get_by_role(
            "heading", name=re.compile(r"^Item \d+ \(1 of \d+ in this queue\)")
        )
        header.wait_for()
        page.locator(".rs-marked mark").first.wait_for()  # the flagged span
        # The keyboard: "a" accepts the item and moves on.
        page.locator("body").press("a")
        page.get_by_text(re.compile(r"^Item \d+ accepted\.")).wait_for(timeout=ANALYSE_MS)
        page.get_by_text(re.compile(r"ann: accept|1 reviewed by you")).first.wait_for()
        _assert_no_exception(page)
        full_page_screenshot(page, ARTIFACTS / "review.png")

        # The answer's audit report: built, downloaded, opened offline.
        page.get_by_role("button", name=re.compile("Build audit report")).click()
        get = page.get_by_role("button", name=re.compile(r"Download report \(HTML\)"))
        get.wait_for(timeout=ANALYSE_MS)
        with page.expect_download() as info:
            get.click()
        report_path = ARTIFACTS / "audit_report.html"
        info.value.save_as(report_path)
    report = browser.new_page(viewport={"width": 1200, "height": 1000})  # type: ignore[attr-defined]
    try:
        fetched: list[str] = []
        report.on("request", lambda r: fetched.append(r.url))
        report.goto(report_path.as_uri(), wait_until="load")
        for heading in ("Example", "Verdicts", "Explanations", "Reviewer decisions"):
            report.get_by_role("heading", name=heading, exact=True).wait_for()
        report.locator(".js-plotly-plot").first.wait_for(state="visible")
        assert report.locator("table.rs").count() >= 2
        assert report.get_by_text("ann", exact=True).count() >= 1
        assert all(u.startswith(("file:", "data:", "blob:")) for u in fetched), fetched
        full_page_screenshot(report, ARTIFACTS / "audit_report.png")
    finally:
        report.close()


def test_learn_in_chromium(server: str, browser: object) -> None:
    with _opened(browser, server, "learn", "Learn") as page:
        walks = (
            (None, 4, "learn_primer"),
            ("ReDeEP / InterpDetect", 6, "learn_redeep"),
            ("SPAD", 5, "learn_spad"),
            ("RAGLens", 5, "learn_raglens"),
            ("CORTEX", 5, "learn_cortex"),
        )
        for walk, n, name in walks:
            if walk is not None:
                page.get_by_text(walk, exact=True).click()
            page.get_by_text(re.compile(rf"^Step 1 of {n}: ")).wait_for(timeout=ANALYSE_MS)
            page.locator(".katex").first.wait_for()  # the step's formula
            _assert_no_exception(page)
            full_page_screenshot(page, ARTIFACTS / f"{name}_first.png")
            for k in range(2, n + 1):
                wait_idle(page, ANALYSE_MS)  # the rerun has settled: one Next button
                nxt = page.get_by_role("button", name=re.compile("Next"))
                expect(nxt).to_have_count(1, timeout=ANALYSE_MS)
                nxt.click()
                page.get_by_text(re.compile(rf"^Step {k} of {n}: ")).wait_for(timeout=ANALYSE_MS)
            page.get_by_role("button", name=re.compile("Edit this answer's context")).wait_for()
            _assert_no_exception(page)
            full_page_screenshot(page, ARTIFACTS / f"{name}_last.png")
