"""What the real-browser tests share: Debian's Chromium through Playwright, and
``streamlit run app/main.py`` started on a free port and waited for.

Chromium is the Debian package (``/usr/bin/chromium``). Without it a browser test is
skipped, except in CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from tools import browser
from tools.browser import CHROMIUM, CHROMIUM_ARGS, start_app, stop_app, wait_healthy

REPO = Path(__file__).resolve().parents[2]
SERVER_START_S = 90


def _require_chromium() -> None:
    if CHROMIUM.is_file():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("Chromium missing: install the Debian package chromium")
    pytest.skip(f"{CHROMIUM} not found; install the Debian package chromium to run browser tests")


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no server log)"


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A function giving a free TCP port on 127.0.0.1."""
    return browser.free_port


@contextmanager
def _streamlit(
    env: Mapping[str, str], log_path: Path, port: int, extra: Sequence[str]
) -> Iterator[str]:
    _require_chromium()
    full = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # Detectors a developer trained under ~/.cache must not appear in a test's app.
        "RAGSCOPE_TRAINED_DIR": str(log_path.parent / f"trained-detectors-{port}"),
        "RAGSCOPE_HOME_DATASET": "demo",  # the quick demo, 12 answers (a test may override)
        **env,
    }
    proc = start_app(full, log_path, port, extra)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(proc, url, SERVER_START_S)
        except RuntimeError as e:
            pytest.fail(f"{e}:\n{_log_tail(log_path)}")
        yield url
    finally:
        stop_app(proc)


@pytest.fixture(scope="session")
def launch_streamlit() -> Callable[..., AbstractContextManager[str]]:
    """``launch_streamlit(env, log_path, port=None, extra=())``: a context manager that
    runs the app with ``env`` added to this process's environment (offline), waits
    for its health check and yields its URL; stopped when the block ends. Skips (or,
    in CI, fails) without Chromium."""

    def launch(
        env: Mapping[str, str],
        log_path: Path,
        port: int | None = None,
        extra: Sequence[str] = (),
    ) -> AbstractContextManager[str]:
        return _streamlit(env, log_path, port or browser.free_port(), extra)

    return launch


@contextmanager
def _chromium() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    _require_chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def open_chromium() -> Callable[[], AbstractContextManager[object]]:
    """A context manager factory: headless Debian Chromium through Playwright."""
    return _chromium
