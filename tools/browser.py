"""What drives the app in a real browser, shared by the browser tests and ``tools.bench_app``:
Debian's Chromium and its flags, a free port, and ``streamlit run app/main.py`` waited for."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from playwright.sync_api import Page, ViewportSize, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


STATUS_WIDGET = '[data-testid="stStatusWidget"]'
"""Streamlit's "Running..." widget: on the page while a script run is under way."""
BUSY = f'{STATUS_WIDGET}, [data-stale="true"]'
"""A script run under way: its "Running..." widget, or an element of the last run that
this one has not drawn again yet (greyed out; the widget alone can be missing or lag)."""
TIMING_CLASS = '[class*="st-key-rs-estimate-timing-"]'
"""A caption waiting for an estimate's background timing (``app.components.estimate.
TIMING_KEY``; tools do not import the app): its page runs again when the timing ends."""
IDLE_HOLD_MS = 600
"""How long the page must stay idle before a run counts as over (the widget can lag)."""


def wait_idle(page: Page, timeout_ms: float) -> None:
    """Wait until the app's script run is over (no "Running..." widget): until then a rerun
    can still be replacing elements, and a stale copy of a button can sit beside its new one.

    A rerun asked for a moment ago (a key press that commits a widget) may not show its
    widget yet, so the page must stay idle (:data:`BUSY`: no widget, no stale element) for
    ``IDLE_HOLD_MS`` twice running. A page timing an answer for its estimate in the
    background (:data:`TIMING_CLASS`) runs again when the timing ends, so it is not idle
    before that either."""
    widget = page.locator(BUSY)
    timing = page.locator(TIMING_CLASS)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        left = max(1.0, (deadline - time.monotonic()) * 1000)
        expect(timing).to_have_count(0, timeout=left)
        expect(widget).to_have_count(0, timeout=left)
        page.wait_for_timeout(IDLE_HOLD_MS)
        if widget.count() == 0 and timing.count() == 0:
            return


def choose(page: Page, label: str, option: str | re.Pattern[str], timeout_ms: float) -> None:
    """Pick ``option`` in the select box whose label contains ``label``, once the script run
    is over. A click while a rerun replaces the box (or while another list closes) can be
    swallowed and leave the list shut, so the box is opened again until the option shows."""
    box = page.locator('[data-testid="stSelectbox"]', has_text=label).get_by_role("combobox")
    choice = page.get_by_role("option", name=option)
    for attempt in range(5):
        wait_idle(page, timeout_ms)
        box.click()
        try:
            choice.wait_for(timeout=5_000)
            break
        except PlaywrightTimeout:
            if attempt == 4:
                raise
            page.keyboard.press("Escape")
    choice.click()


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_app(
    env: Mapping[str, str],
    log_path: Path,
    port: int,
    extra: Sequence[str] = (),
    *,
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """``streamlit run app/main.py`` on ``127.0.0.1:port`` with ``env`` (the whole
    environment), its output into ``log_path`` (appended to, or a fresh file)."""
    cmd = [
        sys.executable, "-m", "streamlit", "run", "app/main.py",
        "--server.port", str(port), "--server.address", "127.0.0.1",
        "--server.headless", "true", "--browser.gatherUsageStats", "false", *extra,
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab" if append else "wb") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=dict(env), stdout=log, stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    """Wait until the server at ``url`` answers its health check.

    Raises:
        RuntimeError: It exited, or did not answer within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"streamlit did not answer in {timeout_s:.0f} s")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    """Terminate a server process (kill it if it does not stop in ``timeout_s``)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def stop_app(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the Streamlit server (kill it if it does not stop in 15 s)."""
    stop_process(proc)


PAINTED_JS = """() => new Promise(done => requestAnimationFrame(() =>
    requestAnimationFrame(() => done(true))))"""
"""Resolves once the browser has laid out and painted a frame after the call: the second
animation frame comes after the first one's layout and paint."""

CONTENT_HEIGHT_JS = """() => {
    const main = document.querySelector('[data-testid="stMain"]');
    if (main) main.scrollTo(0, 0);
    return Math.max(main ? main.scrollHeight : 0, document.body.scrollHeight);
}"""
"""The app's whole height, its inner scroll container back at the top."""


def painted(page: Page) -> None:
    """Wait until the page has been laid out and painted at its current viewport (after
    a resize: Streamlit's columns and the charts' widths do not change with the height)."""
    page.evaluate(PAINTED_JS)


def grow_to_content(page: Page) -> ViewportSize:
    """Grow the viewport to the app's whole height (Streamlit scrolls an inner container,
    not the body) and wait for the painted frame; returns the size to restore."""
    size = page.viewport_size
    assert size is not None, "a page opened with a viewport"
    height = page.evaluate(CONTENT_HEIGHT_JS)
    page.set_viewport_size({"width": size["width"], "height": int(height) + 40})
    painted(page)
    return size


def full_page_screenshot(page: Page, path: Path) -> None:
    """Screenshot the whole app (the viewport grown to the content's height first)."""
    size = grow_to_content(page)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)
