"""One rule picks the set that judges an answer, after a set is adapted too (issue 67):
the demo's answers, adapted to from 20 reviews, are judged by the adapted set in
``ragscope judge demo``, in the Python API and on the Playground, with equal
probabilities, thresholds, spans and set id; the sidebar names that set.

Before, the CLI read ``demo`` answers as dataset ``demo`` while the app read them as
``ragscope-demo`` (their records' name), so the CLI judged them with the base set."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.state.session import STATE_KEY
from app.text import md
from core.base.paths import adapted_sets_dir
from core.cli import main
from core.data import demo_full_examples, random_order, resolve_dataset
from core.engine.model import LoadedModel
from core.pipeline.judge import judge
from core.pipeline.sets import load_set
from core.review import AnswerBook
from core.services.adapting import adapt_set
from core.storage import Store

PLAYGROUND = "views/playground.py"
EXAMPLE = "demo-02-waggle-dance"
QUEUE = "builtin:demo-full"


@pytest.fixture
def adapted(
    calibrated_tiny_set: tuple[Path, Path],
    app_env: Path,
    tiny_model: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """The calibrated tiny set as the app's, adapted to the demo's dataset from 20
    answers reviewed in its random order (by their gold labels); the adapted set's name."""
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(calibrated_tiny_set[0]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    examples = resolve_dataset("demo-full")[1]
    by_id = {e.id: e for e in examples}
    key = tiny_model.info.key
    with Store(app_env) as store:
        book = AnswerBook(store)
        for i in random_order(list(by_id), "ragscope-demo")[:20]:
            ex = by_id[i]
            label = "hallucinated" if ex.label else "faithful"
            book.mark(QUEUE, ex, "ann", label, drawn_by="random")
        result = adapt_set(store, tiny_model, load_set(key), QUEUE, examples, adapted_sets_dir(key))
    assert result.dataset == "ragscope-demo"
    return result.folder.name


def test_the_cli_the_api_and_the_playground_judge_an_adapted_answer_alike(
    adapted: str,
    open_after_analysis: Callable[[str, str], AppTest],
    tiny_model: LoadedModel,
    tmp_path: Path,
) -> None:
    # Every path names the demo's answers alike: as their records do.
    assert {e.provenance.dataset for e in demo_full_examples()} == {"ragscope-demo"}
    assert {e.provenance.dataset for e in resolve_dataset("demo")[1]} == {"ragscope-demo"}

    # The Python API
    ex = next(e for e in resolve_dataset("demo")[1] if e.id == EXAMPLE)
    api = judge(tiny_model, ex, load_set(tiny_model.info.key))
    assert api.set_name == adapted and api.deferred_from == "custom"
    assert api.set_id.startswith(f"{adapted}@")

    # ragscope judge demo (no --set, no --judge-as)
    out = tmp_path / "v.jsonl"
    assert main(["judge", "demo[:2]", "--model", "tiny", "--device", "cpu", "--out", str(out)]) == 0
    cli = next(r for r in map(json.loads, out.read_text().splitlines()) if r["id"] == EXAMPLE)
    rec = api.to_record()
    assert (cli["set"], cli["set_id"]) == (adapted, api.set_id)
    assert cli["probability"] == pytest.approx(rec["probability"], abs=1e-9)
    assert cli["threshold"] == pytest.approx(rec["threshold"], abs=1e-9)
    for name, d in rec["detectors"].items():
        got = cli["detectors"][name]
        assert got["probability"] == pytest.approx(d["probability"], abs=1e-9), name
        assert got["threshold"] == pytest.approx(d["threshold"], abs=1e-9), name
        assert (got["calibrated_for"], got["hallucinated"]) == (
            d["calibrated_for"],
            d["hallucinated"],
        ), name
    assert [(s["start"], s["end"], s["type"]) for s in cli["spans"]] == [
        (s["start"], s["end"], s["type"]) for s in rec["spans"]
    ]

    # The Playground, on the same answer picked from Home's demo and analysed
    at = open_after_analysis(EXAMPLE, PLAYGROUND)
    shown = at.session_state[STATE_KEY].analysis.example
    assert shown.provenance.dataset == "ragscope-demo"
    table = next(t.value for t in at.table if "verdict" in t.value.columns)
    for _, row in table.iterrows():
        d = rec["detectors"][row["detector"]]
        assert row["score"] == pytest.approx(d["probability"], abs=1e-9)
        assert row["threshold"] == pytest.approx(d["threshold"], abs=1e-9)
        assert row["calibrated for"] == (d["calibrated_for"] or "all its training data")
    colour = "red" if api.hallucinated else "green"
    assert f"#### :{colour}-background[{md(api.summary)}]" in [m.value for m in at.markdown]
    # the sidebar names the set that judges the Home dataset's answers, and its id
    sidebar = " ".join(c.value for c in at.sidebar.caption)
    assert f"the {adapted} set (adapted from 20 reviews)" in sidebar
    assert api.set_id in sidebar
