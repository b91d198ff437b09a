"""Audit reports (tiny model, the demo detectors): one answer's report holds the example,
every detector's verdict and view, the reviews; the dataset report the agreement; both
are self-contained (nothing fetched when opened)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from app.components.report import answer_report_html, dataset_report_html
from core.analysis.detector_agreement import verdict_table
from core.data import load_builtin
from core.detectors import load_shipped
from core.pipeline.extract import run_example
from core.pipeline.sets import load_set
from core.review import Flag, ReviewBook, dataset_verdicts
from core.storage import Store

NAMES = ("nll", "context_gain", "cortex")


def _external_refs(page: str) -> list[str]:
    """Resources a browser would fetch on opening: scripts, styles, images, frames."""
    tags = r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["'](?:https?:)?//"""
    return re.findall(tags, page)


def test_answer_report_shows_verdicts_views_and_reviews(
    demo_detectors_dir: Path, tiny_model, tmp_path: Path
) -> None:
    dets = {n: load_shipped(n, tiny_model.info.key, demo_detectors_dir) for n in NAMES}
    ex = next(e for e in load_builtin() if e.spans)
    feats = run_example(tiny_model, ex, list(dets.values()))
    verdicts = {n: d.predict(feats[n]) for n, d in dets.items()}
    with Store(tmp_path / "r.sqlite3") as s:
        book = ReviewBook(s)
        span = ex.spans[0]
        book.add_flags("corpus", [ex], [Flag(example_id=ex.id, start=span.start, end=span.end,
                                             sources={"cortex": (0.9, 0.5)})])  # fmt: skip
        item = book.items("corpus")[0]
        book.save_review(item.id, "ann", "accept", kind="conflict", evidence="subtle",
                         note="says 1820, passage says 1821")  # fmt: skip
        reviews = book.items("corpus")
    page = answer_report_html(
        example=ex,
        model_name=tiny_model.info.display_name,
        verdicts=verdicts,
        detectors=dets,
        features=feats,
        reviews=reviews,
        dataset="Built-in labelled corpus",
    )
    assert page.startswith("<!DOCTYPE html>") and f"Audit report: {ex.id}" in page
    for n, v in verdicts.items():
        assert f"<td>{n}</td><td>{v.score:.3f}</td>" in page
        assert f"id='det-{n}'" in page
    # a token heatmap per detector with token scores, each token's score in its title
    n_tok = sum(v.token_scores is not None for v in verdicts.values())
    assert page.count("rs-heatmap") >= n_tok > 0
    # plotly.js once, inline; nothing fetched from elsewhere
    assert page.count("Plotly.newPlot") >= 1
    assert len(re.findall(r"plotly\.js v\d", page)) == 1
    assert _external_refs(page) == []
    assert "<td>ann</td><td>accept</td>" in page and "Subtle Conflict" in page
    assert "says 1820, passage says 1821" in page


def test_dataset_report_summarises_detectors_and_reviews(
    demo_detectors_dir: Path, tiny_model, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(demo_detectors_dir))
    dset = load_set(tiny_model.info.key).subset(list(NAMES))
    kept, verdicts = dataset_verdicts(tiny_model, load_builtin()[:10], dset)
    table = verdict_table(kept, verdicts, list(NAMES))
    page = dataset_report_html(name="corpus", model_name="tiny", table=table)
    assert "Dataset report: corpus" in page and "10 answers" in page
    for n in NAMES:
        assert f"<td>{n}</td>" in page
    assert "Score correlation" in page and "Where each call matches gold" in page
    assert "No review queue for this dataset." in page
    assert _external_refs(page) == []
    assert np.isfinite(table.scores).all()
