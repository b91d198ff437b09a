"""``python -m tools.bench_pages``, the benchmark of every page's first main action: it
walks the app's own pages, and its notion of a settled view waits for what a visitor
waits for (no server run, nothing drawing, no change for a while)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from app.state.learn import WALK_IDS
from tools import bench_pages

REPO = Path(__file__).resolve().parents[2]


def _sidebar() -> list[tuple[str, str]]:
    """(title, URL path) of every page app/main.py registers, in sidebar order."""
    text = (REPO / "app" / "main.py").read_text(encoding="utf-8")
    pages = re.findall(r'_page\("([a-z_]+)\.py", "([^"]+)"', text)
    assert pages, "app/main.py registers no page with _page(...)"
    return [(title, "" if file == "home" else file) for file, title in pages]


def test_the_bench_walks_every_page_of_the_sidebar_in_its_order() -> None:
    walked = [(name, path) for name, path, *_ in bench_pages.PAGES]
    assert walked == _sidebar()
    for _, path, *_ in bench_pages.PAGES:
        assert (REPO / "app" / "views" / f"{path or 'home'}.py").is_file()


def test_the_bench_opens_every_learn_walkthrough() -> None:
    assert bench_pages.WALKS == tuple(WALK_IDS)


def test_the_bench_reads_the_estimate_a_page_says_before_its_action() -> None:
    said = bench_pages.said_seconds
    assert said("Estimated time on this machine: about 1 min 5 s: 3 of 24 answers") == 65
    assert said("Estimated time on this machine: about 42 s for the 12 detectors") == 42
    assert said("Estimated time on this machine: about 1 h 2 min: 400 of") == 3720
    assert said("Estimated time on this machine: a few seconds: the features") == 5
    assert said("Estimated time: not known yet; the first Analyse") is None


CHANGING = """
<div data-testid="stMain"><p id="out">start</p></div>
<script>
  let n = 0;
  const tick = setInterval(() => {
    document.getElementById('out').textContent = 'step ' + (++n);
    if (n === 10) clearInterval(tick);
  }, 100);
</script>
"""


BUSY_THEN_IDLE = """
<div data-testid="stMain"><p>done drawing</p><div data-testid="stSkeleton" id="s"></div></div>
<script>setTimeout(() => document.getElementById('s').remove(), 1500);</script>
"""


def test_settle_waits_until_the_view_stops_changing_and_nothing_is_busy(open_chromium) -> None:
    with open_chromium() as browser:
        page = browser.new_page()
        t0 = time.perf_counter()
        page.set_content(CHANGING)
        settled = bench_pages.settle(page, t0)
        assert page.locator("#out").inner_text() == "step 10"
        assert 0.8 <= settled < 0.8 + bench_pages.SETTLED_S  # the last change, not the wait

        t0 = time.perf_counter()
        page.set_content(BUSY_THEN_IDLE)
        settled = bench_pages.settle(page, t0)
        assert settled >= 1.4  # a skeleton on the page is not a settled view
        assert page.locator('[data-testid="stSkeleton"]').count() == 0
