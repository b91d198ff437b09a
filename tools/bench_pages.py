"""Time every page's first main action as a newcomer meets it, in headless Chromium.

    python -m tools.bench_pages [--model embedded] [--json]

One fresh server (``streamlit run app/main.py``) on a fresh database, so no feature is
cached and no pace is known: the fourteen pages are opened in the sidebar's order, each
in a new browser session, on the demo examples with the pages' default sizes, as a
newcomer walks them (what one page computed, a later page may reuse: the server's
caches are shared, as they are for a visitor). For each page:

- **open**: from opening the page to its view settled (nothing running, nothing still
  drawing, unchanged for :data:`SETTLED_S`), which includes what the page computes by
  itself (Token heatmaps' rows, the estimate's timed answer);
- **action**: from clicking its main button (Analyse, Compare, Regenerate, Compute, Read,
  Scan) to the view settled again; pages whose view is their action have none;
- **estimate**: what the page said the action would take, read above its button before
  the click, as a ratio to the action's time (issue 55 asks for 1/1.5 to 1.5);
- **again**: the same action once more in a new session, on new work where a link can ask
  for it (more answers, another example, the next answers to scan): its estimate is
  paced on what this server recorded, not on a first timing.

Then each Learn walkthrough is opened by its link (``learn?walk=...``): the time to
read the preset answer as it reads it, to its first step.

``--loop`` then times the teacher's review -> adapt loop on the full demo: Review's whole
answers marked by their gold label with the keyboard, in the page's random order, as many
as adapting needs (:data:`LOOP_MARKS`), then the adaptation job until the page judges with
the adapted set (the marks' time is the page's, not a reader's).

Each time is also given as a ratio to one plain forward pass of the first demo example,
measured in this process before the server starts (the machine is noisy; the ratio is
what compares across machines). Needs the test extra (Playwright) and Debian's Chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from core.data import builtin_examples, demo_full_examples
from core.engine.model import EMBEDDED, load_model, prepare_embedded
from tools.bench_app import plain_forward
from tools.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    STATUS_WIDGET,
    free_port,
    start_app,
    stop_app,
    wait_healthy,
    wait_idle,
)

TIMEOUT_S = 1_800.0
SETTLED_S = 2.0
"""How long a view must stay unchanged, with nothing running, to count as settled."""

BUSY = (
    '[data-testid="stSkeleton"], [data-testid="stSkeletonElement"], '
    '[data-testid="stAppSkeleton"], [data-stale="true"], ' + STATUS_WIDGET
)
SNAPSHOT_JS = f"""() => {{
  const busy = document.querySelector('{BUSY}') !== null;
  const main = document.querySelector('[data-testid="stMain"]');
  return [busy, main ? main.innerText.length + ':' + main.querySelectorAll('*').length : ''];
}}"""


def settle(page: Page, since: float) -> float:
    """Seconds from ``since`` to the last change of the view before it settled."""
    last_change = time.perf_counter()
    last = None
    deadline = since + TIMEOUT_S
    while time.perf_counter() < deadline:
        busy, shape = page.evaluate(SNAPSHOT_JS)
        now = time.perf_counter()
        if busy or shape != last:
            last, last_change = shape, now
        elif now - last_change >= SETTLED_S:
            return last_change - since
        page.wait_for_timeout(200)
    raise TimeoutError(f"{page.url} did not settle in {TIMEOUT_S:.0f} s")


def click(label: str) -> Callable[[Page], None]:
    def act(page: Page) -> None:
        page.get_by_role("button", name=label).first.click()

    return act


ESTIMATE = re.compile(
    r"Estimated time on this machine: (a few seconds|about ([0-9hmins ]+?))(?::| for)"
)
"""What an estimate caption says (:func:`app.components.estimate.describe_work`)."""

FEW_SECONDS = 5.0


def said_seconds(text: str) -> float | None:
    """The seconds the page's estimate says (``a few seconds``: 5), ``None`` when it
    shows none (or says the time is unknown yet)."""
    m = ESTIMATE.search(text)
    if m is None:
        return None
    if m.group(2) is None:
        return FEW_SECONDS
    total = 0.0
    for n, unit in re.findall(r"(\d+) (h|min|s)\b", m.group(2)):
        total += int(n) * {"h": 3600, "min": 60, "s": 1}[unit]
    return total


def estimate_shown(page: Page) -> float | None:
    """The estimate in the page's main column now."""
    return said_seconds(page.locator('[data-testid="stMain"]').inner_text())


def sign_in(page: Page) -> None:
    """Review asks for the reviewer's name first (part of opening the page); once the
    queue holds spans, its scan form is folded away ("Build the queue") and opened."""
    page.get_by_test_id("stTextInputField").fill("Ada")
    page.get_by_role("button", name="Start reviewing").click()
    settle(page, time.perf_counter())
    if not page.get_by_role("button", name="Scan and queue").first.is_visible():
        page.get_by_text("Build the queue", exact=True).first.click()


@dataclass(frozen=True)
class PageTime:
    page: str
    action: str | None
    open_s: float
    action_s: float | None
    estimate_s: float | None = None
    again_s: float | None = None
    again_estimate_s: float | None = None


PAGES: list[tuple[str, str, Callable[[Page], None] | None, str | None, str | None]] = [
    ("Home", "", None, None, None),
    ("Playground", "playground", None, "Analyse", "?example=demo-05"),
    ("Token heatmaps", "token_heatmaps", None, None, None),
    ("Counterfactual context", "counterfactual", None, "Compare", "?example=demo-05"),
    ("Mitigation", "mitigation", None, "Regenerate", "?example=demo-05"),
    ("Heads & layers", "heads", None, "Compute statistics", "?n=36"),
    ("SHAP summary", "shap_summary", None, "Compute SHAP values", "?n=36"),
    ("Token sources", "token_sources", None, None, None),
    ("GAM shape functions", "gam", None, None, None),
    ("Feature explanations", "feature_explanations", None, "Read activations", "?n=64"),
    ("Benchmark", "benchmark", None, None, None),
    ("Agreement", "agreement", None, "Compare", "?n=36"),
    ("Review", "review", sign_in, "Scan and queue", ""),
    ("Learn", "learn", None, None, None),
]
"""Page, URL path, what opening it takes besides loading, its main button, and the query
of its second visit (``None``: none; ``""``: the same link, e.g. Review's scan takes the
next answers). A second visit works on other answers than the first (the pages open on
demo-02): work already done would be read back, not redone."""


def visit(
    browser: object, url: str, enter: Callable[[Page], None] | None, button: str | None
) -> tuple[float, float | None, float | None]:
    """Open ``url`` in a new session: the seconds to open, the estimate shown, and the
    seconds its ``button``'s action took."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    page.goto(url)
    page.locator("h1").first.wait_for(timeout=TIMEOUT_S * 1000)
    if enter is not None:
        settle(page, t0)
        enter(page)
    opened = settle(page, t0)
    said = acted = None
    if button is not None:
        said = estimate_shown(page)
        t1 = time.perf_counter()
        click(button)(page)
        acted = settle(page, t1)
    page.context.close()
    return opened, said, acted


WALKS = ("primer", "redeep", "spad", "raglens", "cortex")
"""Learn's walkthroughs, by their ids in a link (the app's ``WALK_IDS``; a test keeps
the two the same, tools do not import the app)."""

LOOP_MARKS = 20
"""Whole answers marked before adapting (what the Review page asks for at least)."""


@dataclass(frozen=True)
class LoopTime:
    """The review -> adapt loop: opening Review in whole-answer mode, marking
    :data:`LOOP_MARKS` answers (the page's time per mark), and the adaptation job."""

    open_s: float
    marks: int
    marking_s: float
    adapt_s: float


def review_adapt_loop(browser: object, url: str) -> LoopTime:
    """Mark :data:`LOOP_MARKS` whole answers of the full demo by gold, then adapt."""
    gold = {e.id: bool(e.label) for e in demo_full_examples()}
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    page.goto(f"{url}/review?dataset=demo-full")  # Home's default dataset, named
    page.locator("h1").first.wait_for(timeout=TIMEOUT_S * 1000)
    settle(page, t0)
    sign_in(page)
    page.get_by_text("Whole answers", exact=True).click()
    heading = page.get_by_role("heading", name=re.compile(r"^Answer \d+ of \d+"))
    heading.wait_for(timeout=TIMEOUT_S * 1000)
    opened = settle(page, t0)
    t1 = time.perf_counter()
    for _ in range(LOOP_MARKS):
        wait_idle(page, TIMEOUT_S * 1000)
        shown = heading.inner_text().rsplit(" ", 1)[-1]
        page.evaluate("document.activeElement && document.activeElement.blur()")
        page.keyboard.press("h" if gold[shown] else "f")  # the page's shortcuts
        page.get_by_text(re.compile(rf"{re.escape(shown)}.? marked")).first.wait_for(
            timeout=TIMEOUT_S * 1000
        )
    wait_idle(page, TIMEOUT_S * 1000)
    marking = time.perf_counter() - t1
    t2 = time.perf_counter()
    page.get_by_role("button", name="Adapt in the background").click()
    page.get_by_text(re.compile(r"^Adaptation job #\d+ finished")).first.wait_for(
        timeout=TIMEOUT_S * 1000
    )
    adapt = settle(page, t2)
    page.context.close()
    return LoopTime(opened, LOOP_MARKS, marking, adapt)


def _ratio(said: float | None, took: float | None) -> str:
    return "-" if said is None or not took else f"{said / took:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_pages", description=__doc__)
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--loop", action="store_true", help="also time the review -> adapt loop (after the pages)"
    )
    ap.add_argument("--only-loop", action="store_true", help="time the loop alone")
    ap.add_argument(
        "--pages", default=None, metavar="A,B", help="only these pages (their titles), in order"
    )
    args = ap.parse_args(argv)
    if args.model == EMBEDDED:
        prepare_embedded()  # a warm start reads cached weights
    model = load_model(args.model)
    fwd, n_tokens = plain_forward(model, builtin_examples()[0].id, 5)
    del model  # the server loads its own
    tmp = Path(tempfile.mkdtemp(prefix="ragscope-bench-pages-"))
    env = {
        **os.environ,
        "RAGSCOPE_MODEL": args.model,
        "RAGSCOPE_DB": str(tmp / "fresh.sqlite3"),  # nothing cached, no pace known
        "RAGSCOPE_TRAINED_DIR": str(tmp / "trained"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    port = free_port()
    proc = start_app(env, tmp / "server.log", port)
    url = f"http://127.0.0.1:{port}"
    rows: list[PageTime] = []
    walks: dict[str, float] = {}
    loop: LoopTime | None = None
    try:
        wait_healthy(proc, url, TIMEOUT_S)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            only = None if args.pages is None else set(args.pages.split(","))
            chosen = [p for p in PAGES if only is None or p[0] in only]
            for name, path, enter, button, again in [] if args.only_loop else chosen:
                opened, said, acted = visit(browser, f"{url}/{path}", enter, button)
                said2 = acted2 = None
                if again is not None:
                    _, said2, acted2 = visit(browser, f"{url}/{path}{again}", enter, button)
                rows.append(PageTime(name, button, opened, acted, said, acted2, said2))
                told = "" if acted is None else f", {button} {acted:.1f} s (said {said})"
                more = "" if acted2 is None else f", again {acted2:.1f} s (said {said2})"
                print(f"{name}: open {opened:.1f} s{told}{more}", flush=True)
            for walk in [] if args.only_loop or (only and "Learn" not in only) else WALKS:
                walks[walk] = visit(browser, f"{url}/learn?walk={walk}", None, None)[0]
                print(f"Learn, {walk}: open {walks[walk]:.1f} s", flush=True)
            if args.loop or args.only_loop:
                loop = review_adapt_loop(browser, url)
                print(f"Review -> adapt loop: {loop}", flush=True)
            browser.close()
    finally:
        stop_app(proc)
    report = {
        "model": args.model,
        "plain_forward_s": fwd,
        "plain_forward_tokens": n_tokens,
        "pages": [asdict(r) for r in rows],
        "walks": walks,
        "loop": None if loop is None else asdict(loop),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"\nOne plain forward of {builtin_examples()[0].id} ({n_tokens} tokens): "
        f"{fwd * 1000:.0f} ms\n"
    )
    print(
        "| page | open | × forward | main action | time | × forward | estimate / time "
        "| again | estimate / time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        act = "-" if r.action_s is None else f"{r.action_s:.1f} s"
        ratio = "-" if r.action_s is None else f"{r.action_s / fwd:.0f}"
        again = "-" if r.again_s is None else f"{r.again_s:.1f} s"
        print(
            f"| {r.page} | {r.open_s:.1f} s | {r.open_s / fwd:.0f} | {r.action or '(the view)'} "
            f"| {act} | {ratio} | {_ratio(r.estimate_s, r.action_s)} | {again} "
            f"| {_ratio(r.again_estimate_s, r.again_s)} |"
        )
    if walks:
        print("\n| Learn walkthrough | open | × forward |\n|---|---|---|")
        for walk, took in walks.items():
            print(f"| {walk} | {took:.1f} s | {took / fwd:.0f} |")
    if loop is not None:
        print(
            f"\nReview -> adapt on the full demo: Review opened in whole-answer mode in "
            f"{loop.open_s:.1f} s; {loop.marks} answers marked in {loop.marking_s:.1f} s "
            f"({loop.marking_s / loop.marks:.1f} s a mark); the adaptation job "
            f"{loop.adapt_s:.1f} s ({loop.adapt_s / fwd:.0f} x forward)."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
