"""What the real-browser tests share: Debian's Chromium through Playwright, and
``streamlit run app/main.py`` started on a free port and waited for.

Chromium is the Debian package (``/usr/bin/chromium``). Without it a browser test is
skipped, except in CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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
SERVER_START_S = 90


def _require_chromium() -> None:
    if CHROMIUM.is_file():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("Chromium missing: install the Debian package chromium")
    pytest.skip(f"{CHROMIUM} not found; install the Debian package chromium to run browser tests")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no server log)"


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A function giving a free TCP port on 127.0.0.1."""
    return _free_port


@contextmanager
def _streamlit(
    env: Mapping[str, str], log_path: Path, port: int, extra: Sequence[str]
) -> Iterator[str]:
    _require_chromium()
    cmd = [
        sys.executable, "-m", "streamlit", "run", "app/main.py",
        "--server.port", str(port), "--server.address", "127.0.0.1",
        "--server.headless", "true", "--browser.gatherUsageStats", "false", *extra,
    ]  # fmt: skip
    full = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # Detectors a developer trained under ~/.cache must not appear in a test's app.
        "RAGSCOPE_TRAINED_DIR": str(log_path.parent / f"trained-detectors-{port}"),
        **env,
    }
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}:\n{_log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"streamlit did not answer in {SERVER_START_S} s:\n{_log_tail(log_path)}"
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


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
        return _streamlit(env, log_path, port or _free_port(), extra)

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
