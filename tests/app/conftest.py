"""Fixtures for the AppTest page tests: the tiny model and throw-away storage.

Every test gets its own database (``RAGSCOPE_DB``), no shared dev data and no shipped
or locally trained detectors (``RAGSCOPE_DETECTORS_DIR``, ``RAGSCOPE_TRAINED_DIR``), so
the dataset list is exactly the built-in examples plus what the test imports, and only
tests that make detector artifacts see any. The model cache dir is shared by the whole
session (the tiny model's tokenizer is read from the embedded GGUF once), and the loaded
model is shared through ``st.cache_resource``.

The page tests share their helpers as fixtures too: ``open_page`` and
``open_after_analysis`` open a page, ``no_exception``, ``charts``, ``chart``,
``page_text``, ``plotly_array`` and ``z_of`` read what it shows (fixtures, as nothing
imports from tests/).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"
TIMEOUT = 120.0


@pytest.fixture(scope="session")
def app_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ragscope-cache")


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, app_cache_dir: Path) -> Path:
    """Point the app at the tiny model, a fresh database and no shared data; returns the DB."""
    db = tmp_path / "ragscope.sqlite3"
    monkeypatch.setenv("RAGSCOPE_MODEL", "tiny")
    monkeypatch.setenv("RAGSCOPE_DEVICE", "cpu")
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(app_cache_dir))
    monkeypatch.setenv("RAGSCOPE_DB", str(db))
    monkeypatch.setenv("RAGSCOPE_HOME_DATASET", "demo")  # the quick demo: 12 answers
    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "no-shared-data"))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(tmp_path / "no-detectors"))
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained-detectors"))
    monkeypatch.setenv("RAGSCOPE_WARM_DETECTORS", "0")  # no background passes to count
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(tmp_path / "no-shipped-runs"))
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tmp_path / "no-sae"))
    return db


@pytest.fixture
def make_app(app_env: Path) -> Callable[[], AppTest]:
    """A factory of fresh AppTest sessions of ``app/main.py`` (not yet run)."""

    def make() -> AppTest:
        return AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)

    return make


# --------------------------------------------------------------------------- pages

PLAYGROUND = "views/playground.py"


@pytest.fixture
def spy_heights(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[object]]:
    """``spy_heights()``: the ``height`` of every ``st.dataframe`` the pages draw from now
    on, in order (AppTest does not expose an element's height)."""

    def start() -> list[object]:
        heights: list[object] = []
        real = st.dataframe

        def spy(*args: object, **kwargs: object) -> object:
            heights.append(kwargs.get("height", "auto"))
            return real(*args, **kwargs)

        monkeypatch.setattr(st, "dataframe", spy)
        return heights

    return start


def _assert_no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="session")
def no_exception() -> Callable[[AppTest], None]:
    """Asserts that a page shows no exception and no ``st.error``."""
    return _assert_no_exception


@pytest.fixture
def settled() -> Callable[[AppTest], AppTest]:
    """Waits until the page's background timings (its estimates, :func:`app.state.
    estimates.deferred_timing`) are done, then runs the page again: what it says then."""
    from app.state import estimates

    def settle(at: AppTest) -> AppTest:
        estimates.settle()
        return at.run()

    return settle


@pytest.fixture
def open_page(make_app: Callable[[], AppTest]) -> Callable[[str], AppTest]:
    """Opens a page (``views/….py``) in a fresh session; it shows no exception or error."""

    def open_(page: str) -> AppTest:
        at = make_app().run()
        at.switch_page(page).run()
        _assert_no_exception(at)
        return at

    return open_


@pytest.fixture
def open_after_analysis(make_app: Callable[[], AppTest]) -> Callable[[str, str], AppTest]:
    """``(example id, page)``: analyses the built-in example's own answer (pasted) in the
    Playground, then opens ``page`` in the same session."""
    from app.state.playground import ANSWER_PASTE, KEY_ANALYSE, KEY_ANSWER_SOURCE, KEY_EXAMPLE

    def open_(example_id: str, page: str) -> AppTest:
        at = make_app().run()
        at.switch_page(PLAYGROUND).run()
        at.selectbox(key=KEY_EXAMPLE).select(example_id).run()
        at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
        at.button(key=KEY_ANALYSE).click().run()
        at.switch_page(page).run()
        _assert_no_exception(at)
        return at

    return open_


def _charts(at: AppTest) -> dict[str, dict]:
    out = {}
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        out[spec["layout"]["title"]["text"]] = spec
    return out


@pytest.fixture(scope="session")
def charts() -> Callable[[AppTest], dict[str, dict]]:
    """The page's plotly figures (JSON specs) by title."""
    return _charts


@pytest.fixture(scope="session")
def chart() -> Callable[[AppTest, str], dict]:
    """The one plotly figure on the page whose title starts with a prefix."""

    def chart_(at: AppTest, prefix: str) -> dict:
        hits = [spec for title, spec in _charts(at).items() if title.startswith(prefix)]
        assert len(hits) == 1, (prefix, list(_charts(at)))
        return hits[0]

    return chart_


@pytest.fixture(scope="session")
def page_text() -> Callable[[AppTest], str]:
    """The page's markdown, captions, infos and warnings, one per line."""

    def text(at: AppTest) -> str:
        parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
        return "\n".join(parts + [i.value for i in at.info] + [w.value for w in at.warning])

    return text


@pytest.fixture(scope="session")
def plotly_array() -> Callable[[object], np.ndarray]:
    """A plotly JSON array (a plain list or the typed-array encoding) as floats."""

    def array(v: object) -> np.ndarray:
        if isinstance(v, dict):
            raw = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
            if "shape" in v:
                raw = raw.reshape(tuple(int(n) for n in str(v["shape"]).split(",")))
            return raw.astype(float)
        return np.asarray(v, dtype=float)

    return array


@pytest.fixture(scope="session")
def z_of(plotly_array: Callable[[object], np.ndarray]) -> Callable[[dict], np.ndarray]:
    """The ``z`` grid of a figure's first trace (a heatmap's values)."""
    return lambda spec: plotly_array(spec["data"][0]["z"])


@pytest.fixture(scope="session")
def demo_detectors_dir(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``nll``, ``context_gain`` and ``cortex`` (3 epochs) fitted on the demo examples with
    the tiny model, saved as a detectors folder (for ``RAGSCOPE_DETECTORS_DIR``)."""
    from core.data import builtin_examples
    from core.detectors import make_detector
    from core.pipeline.extract import extract_features

    out = tmp_path_factory.mktemp("demo-detectors")
    examples = builtin_examples()
    dets = [make_detector("nll"), make_detector("context_gain"), make_detector("cortex", epochs=3)]
    feats = extract_features(tiny_model, examples, dets).features
    for d in dets:
        d.fit(list(feats[d.name]), examples).save(out / d.name)
    return out


@pytest.fixture
def with_demo_detectors(
    demo_detectors_dir: Path, monkeypatch: pytest.MonkeyPatch, app_env: Path
) -> Path:
    """The app sees :func:`demo_detectors_dir` as its shipped detectors."""
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(demo_detectors_dir))
    return demo_detectors_dir


_AUTH = {
    "redirect_uri": "http://localhost:8501/oauth2callback",
    "cookie_secret": "x" * 32,
    "client_id": "ragscope",
    "client_secret": "secret",
    "server_metadata_url": "http://127.0.0.1:1/.well-known/openid-configuration",
}


@pytest.fixture(scope="session")
def with_login() -> Callable[..., AppTest]:
    """Configures Streamlit's OpenID Connect login on an app and sets its visitor:
    ``with_login(at, user, redirect_uri=...)`` (keyword arguments change ``[auth]``)."""

    def configure(at: AppTest, user: dict, **auth: str) -> AppTest:
        at.secrets["auth"] = {**_AUTH, **auth}
        at.user = user
        return at

    return configure
