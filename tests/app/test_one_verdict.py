"""One verdict everywhere (issue 37): the same answer opened on every page that shows a
score or a verdict for it — Playground, Token heatmaps, Token sources, Heads & layers,
Counterfactual, Mitigation, Agreement — shows the numbers of
``core.pipeline.judge.judge(model, example, load_set(key))``: each detector's calibrated
probability, the threshold of the same calibration, and its flag.

The set's detectors keep a calibration of the demo answers' own dataset whose threshold
is far from the pooled one, so a page that judged with a detector's pooled calibration
(``det.predict``), or compared a raw score with the calibrated threshold, shows other
numbers and fails here.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import core.base.paths
from app.state.counterfactual import KEY_COMPARE
from app.state.mitigation import KEY_FEEDBACK, KEY_TEMPERATURE
from app.state.playground import ANSWER_PASTE, KEY_ANALYSE, KEY_ANSWER_SOURCE, KEY_EXAMPLE
from app.state.session import STATE_KEY
from app.text import md
from core.data import builtin_examples
from core.detectors import load_shipped, make_detector
from core.engine.model import LoadedModel
from core.evaluation.recipe import trained_on_record
from core.learning.calibration import DatasetCalibration, PlattCalibrator
from core.learning.contract import Verdict, calibrated_as
from core.pipeline.extract import run_example
from core.pipeline.judge import AnswerVerdict, judge
from core.pipeline.sets import EXPERTS_FILE, load_set

EXAMPLE = "demo-02-waggle-dance"  # hand-written, one gold span
DEMO = "ragscope-demo"  # the demo answers' dataset (their provenance)
PLAYGROUND = "views/playground.py"
PAGES = {
    "heatmaps": "views/token_heatmaps.py",
    "sources": "views/token_sources.py",
    "heads": "views/heads.py",
    "counterfactual": "views/counterfactual.py",
    "mitigation": "views/mitigation.py",
    "agreement": "views/agreement.py",
}


def _platt(a: float, b: float) -> PlattCalibrator:
    return PlattCalibrator.from_json({"kind": "platt", "a": a, "b": b, "n": 40})


@pytest.fixture(scope="module")
def one_set(
    demo_detectors_dir: Path, tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """nll, context_gain, cortex, spad, redeep_token and redeep_chunk fitted on the demo
    answers, each keeping a pooled calibration and one of the demo dataset's own (another
    probability, another threshold)."""
    out = tmp_path_factory.mktemp("one-verdict")
    for d in demo_detectors_dir.iterdir():
        shutil.copytree(d, out / d.name)
    examples = builtin_examples()
    more = [
        make_detector("spad", n_iter=3, cv=2),
        make_detector("redeep_token"),
        make_detector("redeep_chunk"),
    ]
    feats = [run_example(tiny_model, ex, more) for ex in examples]
    for d in more:
        d.fit([f[d.name] for f in feats], examples).save(out / d.name)
    for folder in sorted(out.iterdir()):
        det = load_shipped(folder.name, tiny_model.info.key, out)
        det.calibration_ = _platt(1.0, 0.0)
        det.threshold_ = 0.5
        det.dataset_calibration_ = {
            DEMO: DatasetCalibration(
                calibrator=_platt(2.0, -0.5), threshold=0.42, n=12, n_positive=6
            )
        }
        shutil.rmtree(folder)
        det.save(folder)
    return out


EXPERT = "demo-only"
EXPERT_THRESHOLD = 0.3  # the expert's own calibration of the demo answers


@pytest.fixture(scope="module")
def expert_set(
    one_set: Path, tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A folder of shipped sets holding ``demo-only``: one_set's detectors (the same
    features) trained on the demo answers alone, with calibrations of their own."""
    sets = tmp_path_factory.mktemp("expert-sets")
    examples = builtin_examples()
    record = trained_on_record(None, dataset=DEMO, parts={DEMO: examples}, fitted=examples)
    for folder in sorted(one_set.iterdir()):
        det = load_shipped(folder.name, tiny_model.info.key, one_set)
        det.calibration_ = _platt(1.5, 0.3)
        det.dataset_calibration_ = {
            DEMO: DatasetCalibration(
                calibrator=_platt(3.0, -1.0), threshold=EXPERT_THRESHOLD, n=12, n_positive=6
            )
        }
        det.save(sets / EXPERT / folder.name, extra={"trained_on": record})
    return sets


def _flag(hit: bool | None) -> str:
    return {True: "flagged", False: "not flagged", None: "-"}[hit]


def _text(at: AppTest) -> str:
    return "\n".join(
        [m.value for m in at.markdown] + [c.value for c in at.caption] + [i.value for i in at.info]
    )


def _close(a: object, b: float) -> bool:
    return a == pytest.approx(b, abs=1e-6)


def _check_reading_pages(
    at: AppTest, v: Mapping[str, Verdict], no_exception: Callable[[AppTest], None]
) -> None:
    """Token heatmaps, Token sources and Heads & layers show the judge's numbers."""
    # Token heatmaps: CORTEX's answer probability, threshold and flag.
    at.switch_page(PAGES["heatmaps"]).run()
    no_exception(at)
    c = v["cortex"]
    assert (
        f"CORTEX answer probability {c.score:.3f}" in _text(at)
        and f"flagged at {c.threshold:.3f}: **"
        f"{'hallucinated' if c.hallucinated else 'not flagged'}**"
        in _text(at)
    )
    # Its p_stay is CORTEX's own answer-level one, named apart from the page's slider.
    assert "answer-level p_stay" in _text(at) and "not the p_stay slider" in _text(at)

    # Token sources: the spad sentence (probability and threshold of one calibration;
    # the waterfall's score labelled raw).
    at.switch_page(PAGES["sources"]).run()
    no_exception(at)
    s = v["spad"]
    flag = "flagged as hallucinated" if s.hallucinated else "not flagged"
    assert (
        f"a probability of **{s.score:.3f}** (threshold {s.threshold:.3f} from {DEMO}'s "
        f"calibration: {flag};" in _text(at)
    )
    assert s.raw_score is not None and f"explains its raw score {s.raw_score:.3f}" in _text(at)

    # Heads & layers: both ReDeEP detectors' lines; the chunk scores labelled raw.
    at.switch_page(PAGES["heads"]).run()
    no_exception(at)
    for name in ("redeep_token", "redeep_chunk"):
        r = v[name]
        assert (
            f"{name} detector gives this answer a probability **{r.score:.3f}** "
            f"(threshold {r.threshold:.3f}: {_flag(r.hallucinated)})" in _text(at)
        )
    chunks = next(t.value for t in at.table if "gold" in t.value.columns)
    assert "redeep_chunk raw score" in chunks.columns
    assert not [c for c in chunks.columns if "probability" in c]


def _check_action_pages(
    at: AppTest, want: AnswerVerdict, no_exception: Callable[[AppTest], None]
) -> None:
    """Counterfactual and Mitigation show the judge's numbers for the original answer."""
    v = want.verdicts
    colour = "red" if want.hallucinated else "green"
    # Counterfactual: the original side of a comparison (context unchanged).
    at.switch_page(PAGES["counterfactual"]).run()
    at.button(key=KEY_COMPARE).click().run()
    no_exception(at)
    cf = next(d.value for d in at.dataframe if "original verdict" in d.value.columns)
    assert set(cf["detector"]) == set(v)
    for _, row in cf.iterrows():
        x = v[row["detector"]]
        assert _close(row["original"], x.score) and row["original verdict"] == _flag(x.hallucinated)
    assert any(f"**Original:** :{colour}[{md(want.summary)}]" in m.value for m in at.markdown)

    # Mitigation: the original answer's column of the re-scored answers.
    at.switch_page(PAGES["mitigation"]).run()
    at.number_input(key=KEY_TEMPERATURE).set_value(1.0).run()
    at.button(key=KEY_FEEDBACK).click().run()
    no_exception(at)
    mit = next(d.value for d in at.dataframe if "original verdict" in d.value.columns)
    mit = mit.set_index("detector")
    overall = mit.loc[f"overall ({want.judge})"]
    assert _close(overall["original"], want.probability)
    assert overall["original verdict"] == _flag(want.hallucinated)
    for name, x in v.items():
        assert _close(mit.loc[name, "original"], x.score)
        assert mit.loc[name, "original verdict"] == _flag(x.hallucinated)
        thr = mit.loc[name, "threshold" if "threshold" in mit else "original threshold"]
        assert _close(thr, x.threshold)  # type: ignore[arg-type]


@pytest.mark.parametrize("deferring", [False, True], ids=["by-the-set", "by-its-expert"])
def test_every_page_shows_the_judge_s_numbers_for_one_answer(
    make_app: Callable[[], AppTest],
    one_set: Path,
    expert_set: Path,
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: LoadedModel,
    no_exception: Callable[[AppTest], None],
    tmp_path: Path,
    deferring: bool,
) -> None:
    """By the set, and by the expert it defers the demo answers to (``experts.json``):
    every page then shows the expert's numbers, and the Playground names it."""
    folder, threshold = one_set, 0.42
    if deferring:
        folder, threshold = Path(shutil.copytree(one_set, tmp_path / "custom")), EXPERT_THRESHOLD
        (folder / EXPERTS_FILE).write_text(f'{{"experts": ["{EXPERT}"]}}', encoding="utf-8")
        monkeypatch.setattr(core.base.paths, "detector_sets_dir", lambda: expert_set)
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(folder))
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    at.selectbox(key=KEY_EXAMPLE).select(EXAMPLE).run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.button(key=KEY_ANALYSE).click().run()
    no_exception(at)
    example = at.session_state[STATE_KEY].analysis.example
    assert example.response == next(e for e in builtin_examples() if e.id == EXAMPLE).response
    want: AnswerVerdict = judge(tiny_model, example, load_set(tiny_model.info.key))
    v = want.verdicts
    assert set(v) == {"nll", "context_gain", "cortex", "spad", "redeep_token", "redeep_chunk"}
    # The demo dataset's own calibration judged it: the pooled one would disagree.
    assert all(x.calibrated_for == DEMO and x.threshold == threshold for x in v.values())
    dset = load_set(tiny_model.info.key)
    by = dset.for_example(example)
    pooled = {n: calibrated_as(by.card(n).detector, x, None) for n, x in v.items()}
    assert all(abs(pooled[n].score - x.score) > 1e-3 for n, x in v.items())
    if deferring:  # the expert judged it, and the set's own detectors would not agree
        assert (want.set_name, want.deferred_from) == (EXPERT, "custom")
        own = judge(tiny_model, example, dataclasses.replace(dset, experts={})).verdicts
        assert all(abs(own[n].score - x.score) > 1e-3 for n, x in v.items())
        assert f"Judged by the **{EXPERT}** set, the custom set's expert" in _text(at)
    else:
        assert (want.set_name, want.deferred_from) == ("custom", None)

    # Playground: the verdict line and every row of the table.
    colour = "red" if want.hallucinated else "green"
    assert f"#### :{colour}-background[{md(want.summary)}]" in [m.value for m in at.markdown]
    table = next(t.value for t in at.table if "verdict" in t.value.columns)
    assert list(table["detector"]) == list(v)
    for _, row in table.iterrows():
        x = v[row["detector"]]
        assert _close(row["score"], x.score) and _close(row["threshold"], x.threshold)  # type: ignore[arg-type]
        assert row["verdict"] == _flag(x.hallucinated)
        assert row["calibrated for"] == DEMO

    # Where and why: the judge's spans, or its reason for none, never re-decided here.
    text = _text(at)
    assert "**Where and why** (the set's spans)" in text
    if want.spans:
        spans = next(t.value for t in at.table if "departs from" in t.value.columns)
        assert list(spans["span"]) == [s.text for s in want.spans]
        assert list(spans["type"]) == [s.type for s in want.spans]
        assert list(spans["score"]) == [f"{s.score:.3f}" for s in want.spans]
    else:
        assert want.span_decision is not None and md(want.span_decision.note) in text

    _check_reading_pages(at, v, no_exception)
    _check_action_pages(at, want, no_exception)

    # Agreement: the answer's row of the verdict table (the demo dataset).
    at.switch_page(PAGES["agreement"]).run()
    at.number_input(key="agreement.limit").set_value(3)
    at.button(key="agreement.run").click().run()
    no_exception(at)
    (tab,) = at.session_state["ragscope.agreement"].tables.values()
    assert EXAMPLE in tab.example_ids
    i = tab.example_ids.index(EXAMPLE)
    shown = dict(zip(tab.detectors, tab.scores[i], strict=True))
    calls = dict(zip(tab.detectors, tab.calls[i], strict=True))
    dataset_ex = next(e for e in builtin_examples() if e.id == EXAMPLE)
    there = judge(tiny_model, dataset_ex, load_set(tiny_model.info.key)).verdicts
    for name, x in there.items():
        assert _close(shown[name], x.score) and bool(calls[name]) == x.hallucinated
    # The Playground judged the same answer the dataset holds: one verdict.
    assert {n: (x.score, x.hallucinated) for n, x in there.items()} == {
        n: (x.score, x.hallucinated) for n, x in v.items()
    }
    assert re.search(r"\d+ of 6 detectors flag it", want.summary)
