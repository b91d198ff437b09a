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
  Scan) to the view settled again; pages whose view is their action have none.

Each time is also given as a ratio to one plain forward pass of the first demo example,
measured in this process before the server starts (the machine is noisy; the ratio is
what compares across machines). Needs the test extra (Playwright) and Debian's Chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from core.data import builtin_examples
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


def sign_in(page: Page) -> None:
    """Review asks for the reviewer's name first (part of opening the page)."""
    page.get_by_test_id("stTextInputField").fill("Ada")
    page.get_by_role("button", name="Start reviewing").click()


@dataclass(frozen=True)
class PageTime:
    page: str
    action: str | None
    open_s: float
    action_s: float | None


PAGES: list[tuple[str, str, Callable[[Page], None] | None, str | None]] = [
    ("Home", "", None, None),
    ("Playground", "playground", None, "Analyse"),
    ("Token heatmaps", "token_heatmaps", None, None),
    ("Counterfactual context", "counterfactual", None, "Compare"),
    ("Mitigation", "mitigation", None, "Regenerate"),
    ("Heads & layers", "heads", None, "Compute statistics"),
    ("SHAP summary", "shap_summary", None, "Compute SHAP values"),
    ("Token sources", "token_sources", None, None),
    ("GAM shape functions", "gam", None, None),
    ("Feature explanations", "feature_explanations", None, "Read activations"),
    ("Benchmark", "benchmark", None, None),
    ("Agreement", "agreement", None, "Compare"),
    ("Review", "review", sign_in, "Scan and queue"),
    ("Learn", "learn", None, None),
]
"""Page, URL path, what opening it takes besides loading, and its main button."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_pages", description=__doc__)
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--json", action="store_true")
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
    try:
        wait_healthy(proc, url, TIMEOUT_S)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            for name, path, enter, button in PAGES:
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                t0 = time.perf_counter()
                page.goto(f"{url}/{path}")
                page.locator("h1").first.wait_for(timeout=TIMEOUT_S * 1000)
                if enter is not None:
                    settle(page, t0)
                    enter(page)
                opened = settle(page, t0)
                acted = None
                if button is not None:
                    t1 = time.perf_counter()
                    click(button)(page)
                    acted = settle(page, t1)
                rows.append(PageTime(name, button, opened, acted))
                said = "" if acted is None else f", {button} {acted:.1f} s"
                print(f"{name}: open {opened:.1f} s{said}", flush=True)
                page.context.close()
            browser.close()
    finally:
        stop_app(proc)
    report = {
        "model": args.model,
        "plain_forward_s": fwd,
        "plain_forward_tokens": n_tokens,
        "pages": [asdict(r) for r in rows],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"\nOne plain forward of {builtin_examples()[0].id} ({n_tokens} tokens): "
        f"{fwd * 1000:.0f} ms\n"
    )
    print("| page | open | × forward | main action | time | × forward |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        act = "-" if r.action_s is None else f"{r.action_s:.1f} s"
        ratio = "-" if r.action_s is None else f"{r.action_s / fwd:.0f}"
        print(
            f"| {r.page} | {r.open_s:.1f} s | {r.open_s / fwd:.0f} | {r.action or '(the view)'} "
            f"| {act} | {ratio} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
