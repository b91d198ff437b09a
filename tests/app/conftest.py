"""Fixtures for the AppTest page tests: the tiny model and throw-away storage.

Every test gets its own database (``RAGSCOPE_DB``), no shared dev data and no shipped
detectors (``RAGSCOPE_DETECTORS_DIR``), so the dataset list is exactly the built-in
examples plus what the test imports, and only tests that make detector artifacts see
any. The model cache dir is shared by the whole session (the tiny model's tokenizer is
read from the embedded GGUF once), and the loaded model is shared through
``st.cache_resource``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
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
    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "no-shared-data"))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(tmp_path / "no-detectors"))
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(tmp_path / "no-shipped-runs"))
    return db


@pytest.fixture
def make_app(app_env: Path) -> Callable[[], AppTest]:
    """A factory of fresh AppTest sessions of ``app/main.py`` (not yet run)."""

    def make() -> AppTest:
        return AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)

    return make
