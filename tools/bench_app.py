"""Time the app as a user meets it, in headless Chromium: warm start and Playground latency.

    python -m tools.bench_app [--model embedded] [--repeats 3] [--json]

1. **Warm start**: ``streamlit run app/main.py`` with the model's weights already in the
   cache (``ragscope prepare`` first), timed from launching the server to Home drawn and
   usable in the browser (its title and dataset picker; the model loads meanwhile), and
   to the loaded model's status in the sidebar, ``--repeats`` times, each with a fresh
   server.
2. **Playground**: on the last server, open the Playground on the first demo example (a
   deep link), press *Analyse* and time the click to the whole verdict table: right after
   the model is ready (the detectors still warming up in the background), then, after
   ``--settle`` seconds, on the second demo example (an input the server has not seen),
   then the first again (known: nothing is recomputed). Reported as a ratio to one plain forward pass of that example, measured in
   this process just before (``ragscope bench --playground`` measures the same path
   without the browser).

Needs the test extra (Playwright) and Debian's Chromium (``/usr/bin/chromium``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from playwright.sync_api import Browser, Page, sync_playwright

from core.data import builtin_examples
from core.engine.layout import render
from core.engine.model import EMBEDDED, LoadedModel, load_model, prepare_embedded
from tools.browser import CHROMIUM, CHROMIUM_ARGS, free_port, start_app, stop_app, wait_healthy

START_TIMEOUT_MS = 300_000


@contextmanager
def _server(model: str, log: Path) -> Iterator[tuple[str, float]]:
    """A fresh ``streamlit run`` on a free port: (its URL, when it was launched)."""
    port = free_port()
    env = {
        **os.environ,
        "RAGSCOPE_MODEL": model,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    t0 = time.perf_counter()
    proc = start_app(env, log, port, append=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(proc, url, START_TIMEOUT_MS / 1000)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; see {log}") from e
        yield url, t0
    finally:
        stop_app(proc)


def _first_usable(page: Page, url: str, t0: float, model_name: str) -> tuple[float, float]:
    """Seconds from launching the server to Home drawn and usable (its title and the
    dataset picker, which need no model), and to the loaded model's status."""
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_role("heading", name="ragscope").first.wait_for(timeout=START_TIMEOUT_MS)
    page.get_by_text("Examples for the Playground").first.wait_for(timeout=START_TIMEOUT_MS)
    usable = time.perf_counter() - t0
    page.get_by_text(model_name).first.wait_for(timeout=START_TIMEOUT_MS)
    return usable, time.perf_counter() - t0


def _analyse(page: Page, url: str, example_id: str) -> float:
    """Seconds from clicking *Analyse* to every shipped detector's verdict."""
    page.goto(f"{url}/playground?dataset=demo&example={example_id}", wait_until="domcontentloaded")
    button = page.get_by_role("button", name=re.compile("Analyse"))
    button.wait_for(timeout=START_TIMEOUT_MS)
    t0 = time.perf_counter()
    button.click()
    # The whole verdict table follows the streamed progress (and shows at once when known).
    page.get_by_role("heading", name="Detector verdicts").wait_for(timeout=START_TIMEOUT_MS)
    page.get_by_text("gives a score from 0 to 1").first.wait_for(timeout=START_TIMEOUT_MS)
    return time.perf_counter() - t0


def plain_forward(model: LoadedModel, example_id: str, repeats: int) -> tuple[float, int]:
    """Median seconds of one plain forward pass over the example, and its length."""
    ex = next(e for e in builtin_examples() if e.id == example_id)
    ids = torch.as_tensor(render(ex, model).token_ids, device=model.device).unsqueeze(0)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.hf_model(ids)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), int(ids.shape[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_app", description=__doc__)
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--settle",
        type=float,
        default=20.0,
        help="seconds to wait before the warm Analyse (the detectors warm up in the background)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.model == EMBEDDED:
        prepare_embedded()  # a warm start reads cached weights
    example, other = builtin_examples()[:2]
    model = load_model(args.model)
    model_name = model.info.display_name
    fwd, n_tokens = plain_forward(model, example.id, max(args.repeats, 3))
    fwd_other, n_other = plain_forward(model, other.id, max(args.repeats, 3))
    del model  # the server loads its own
    starts: list[float] = []
    models: list[float] = []
    log = Path(tempfile.mkdtemp(prefix="ragscope-bench-app-")) / "server.log"
    with sync_playwright() as pw:
        browser: Browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        for i in range(args.repeats):
            with _server(args.model, log) as (url, t0):
                page = browser.new_page()
                usable, loaded = _first_usable(page, url, t0, model_name)
                starts.append(usable)
                models.append(loaded)
                if i < args.repeats - 1:
                    page.close()
                    continue
                cold = _analyse(page, url, example.id)  # right after the model is ready
                time.sleep(args.settle)  # the detectors' background warm-up ends meanwhile
                warm = _analyse(page, url, other.id)  # an input the server has not seen
                again = _analyse(page, url, example.id)  # known: nothing is recomputed
                page.close()
        browser.close()
    report = {
        "model": model_name,
        "example": example.id,
        "example_tokens": n_tokens,
        "plain_forward_s": fwd,
        "warm_start_s": starts,
        "warm_start_median_s": statistics.median(starts),
        "model_ready_s": models,
        "model_ready_median_s": statistics.median(models),
        "analyse_right_after_start_s": cold,
        "analyse_right_after_start_ratio": cold / fwd,
        "analyse_warm_example": other.id,
        "analyse_warm_tokens": n_other,
        "analyse_warm_s": warm,
        "analyse_warm_ratio": warm / fwd_other,
        "analyse_known_s": again,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{model_name}: warm start to the first usable page "
            f"{report['warm_start_median_s']:.1f} s (median of {len(starts)}: "
            + ", ".join(f"{s:.1f}" for s in starts)
            + f"); the model loaded and shown in the sidebar {statistics.median(models):.1f} s"
            + f"\nPlayground, click -> full verdicts: {example.id} ({n_tokens} tokens) right "
            f"after the model is ready {cold:.2f} s = {cold / fwd:.1f} x one plain forward "
            f"({fwd * 1000:.0f} ms); {other.id} ({n_other} tokens) after {args.settle:.0f} s "
            f"{warm:.2f} s = {warm / fwd_other:.1f} x ({fwd_other * 1000:.0f} ms); "
            f"{example.id} again {again:.2f} s (known: nothing recomputed)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
