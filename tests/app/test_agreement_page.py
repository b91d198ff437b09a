"""The Agreement page (AppTest, tiny model, the demo detectors): the verdicts of every
chosen detector on the built-in corpus, the correlation the page draws equals the one
computed directly, and an answer opens in Token heatmaps."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from app.components.agreement_charts import GOLD_KEY, MAX_ANSWER_TICKS, gold_matrix_figure
from app.state.heatmaps import KEY_HEATMAP_EXAMPLE
from core.analysis.detector_agreement import VerdictTable, score_correlation, verdict_table
from core.data import load_builtin
from core.pipeline.sets import load_set
from core.review import dataset_verdicts

PAGE = "views/agreement.py"
N = 8


def _paces(db: Path) -> dict[str, float]:
    with sqlite3.connect(db) as c:
        return dict(c.execute("SELECT detectors, seconds_per_char FROM paces").fetchall())


def test_compare_draws_the_detectors_agreement_and_opens_an_answer(
    app_env: Path,
    with_demo_detectors: Path,
    tiny_model,
    open_page: Callable[[str], AppTest],
    chart: Callable[[AppTest, str], dict],
    plotly_array,
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
    spy_heights: Callable[[], list[object]],
    settled: Callable[[AppTest], AppTest],
) -> None:
    shown_heights = spy_heights()
    at = settled(open_page(PAGE))  # the estimate times one answer in the background
    assert "Press **Compare**" in page_text(at)
    timed = _paces(app_env)  # the estimate above the button timed one answer
    assert len(timed) == 1
    at.selectbox(key="agreement.dataset").select_index(1)  # the built-in labelled corpus
    at.number_input(key="agreement.limit").set_value(N)
    at.button(key="agreement.run").click().run()
    no_exception(at)
    # Compare recorded the pace it ran at, its own (the one answer's timing stays for
    # other actions): the next estimate of Compare uses it.
    ran = _paces(app_env)
    (plain,) = timed
    assert ran[plain] == timed[plain] and f"agreement|{plain}" in ran
    names = at.multiselect(key="agreement.detectors").value
    assert set(names) == {"nll", "context_gain", "cortex"}
    dset = load_set(tiny_model.info.key).subset(names)  # the demo detectors, as the page
    kept, verdicts = dataset_verdicts(tiny_model, load_builtin()[:N], dset)
    want = score_correlation(verdict_table(kept, verdicts, names))
    fig = chart(at, "Score correlation (spearman)")
    z = plotly_array(fig["data"][0]["z"]).reshape(len(names), len(names))
    np.testing.assert_allclose(z, want.to_numpy(), atol=1e-9)
    assert chart(at, "Where each detector's call matches gold")
    # Eight answers are too few for correlations: said, and the map greyed.
    assert any(f"come from {N} answers" in w.value for w in at.warning)
    assert any("too few answers" in a["text"] for a in fig["layout"]["annotations"])
    # "Right and wrong together": a static table, every pair in view (no inner scroll)
    (pairs,) = [t.value for t in at.table]
    assert len(pairs) == 3 and set(pairs["A"]) | set(pairs["B"]) == set(names)
    (shown,) = at.dataframe
    listed = shown.value
    assert len(listed) == N and listed["split"].is_monotonic_decreasing
    # every detector's probability beside its flag, the page's three decimals; gold in words
    vt = verdict_table(kept, verdicts, names)
    row = {e: i for i, e in enumerate(vt.example_ids)}
    for _, r in listed.iterrows():
        i = row[r["example"]]
        for k, d in enumerate(names):
            assert r[d] == f"{vt.scores[i, k]:.3f}" + (" ⚑" if vt.calls[i, k] else ""), (d, r[d])
        assert r["gold"] == {1: "hallucinated", 0: "faithful", -1: "-"}[int(vt.gold[i])]
    # shown whole (no inner scrollbar hides a row or a detector), each detector's column
    # as wide as its name (a narrow one cut the name off)
    assert shown_heights == ["content"]
    columns = json.loads(shown.proto.columns)
    assert all(columns.get(d, {}).get("width") is None for d in names), columns
    first = str(listed["example"].iloc[0])
    at.button(key="agreement.open").click().run()
    no_exception(at)
    assert at.selectbox(key=KEY_HEATMAP_EXAMPLE).value == first


def _table(n: int) -> VerdictTable:
    gold = np.array([1, 0, 1, -1] * (n // 4))
    calls = np.stack([gold == 1, np.zeros(n, dtype=bool)], axis=1).astype(int)
    return VerdictTable(
        example_ids=tuple(f"a{i}" for i in range(n)),
        detectors=("one", "two"),
        scores=calls.astype(float),
        calls=calls,
        gold=gold,
    )


def test_the_gold_matrix_has_a_legend_answer_names_and_a_line_between_the_classes() -> None:
    fig = gold_matrix_figure(_table(8), title="t")
    legend = [t.name for t in fig.data if t.showlegend]
    assert legend == [name for name, _ in GOLD_KEY]
    axis = fig.layout.xaxis
    # hallucinated first (a0, a2, a4, a6), then faithful, then unlabelled, each named
    assert list(axis.ticktext) == ["a0", "a2", "a4", "a6", "a1", "a5", "a3", "a7"]
    assert [s.x0 for s in fig.layout.shapes] == [3.5]
    # beyond the limit the columns are named on hover, not under the chart
    many = gold_matrix_figure(_table(MAX_ANSWER_TICKS + 4), title="t")
    assert not many.layout.xaxis.showticklabels and "hover" in many.layout.xaxis.title.text
