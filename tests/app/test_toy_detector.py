"""Issue 54: adding a detector touches its own module, the registry and its tests only.

A toy 13th detector is written here as its own module would be and registered as the
registry would list it; nothing else is touched. It is then an ensemble member by
default, the report draws its explanation by its traits (not by its name), the
Playground's table lists its verdict, and the pages that list detectors offer it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from app.components.report import answer_report_html
from app.state.playground import ANSWER_PASTE, KEY_ANALYSE, KEY_ANSWER_SOURCE, KEY_EXAMPLE
from core.data import builtin_examples
from core.detectors import DETECTORS, available_detectors, make_detector, runnable_detectors
from core.detectors.baselines import CalibratedDetector
from core.detectors.registry import MEMBERS
from core.engine.model import ModelInfo
from core.engine.trace import Needs
from core.learning.contract import DetectorConfig, ExplanationKind, Features, Run
from core.pipeline.extract import extract_features, run_example

TOY = "toy_numbers"
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@dataclass(frozen=True, kw_only=True)
class ToyConfig(DetectorConfig):
    """No options."""


class ToyNumbersDetector(CalibratedDetector):
    """Share of the answer's numbers that no passage holds (text only)."""

    name = TOY
    Config = ToyConfig
    gives_token_scores: ClassVar[bool] = True
    explanation_kind: ClassVar[ExplanationKind] = "contributions"
    reads_text_only: ClassVar[bool] = True

    def needs(self, model: ModelInfo) -> Needs | None:
        return None

    def features(self, run: Run) -> Features:
        known = set(NUMBER.findall(" ".join(run.example.passages)))
        found = list(NUMBER.finditer(run.example.response))
        absent = [m for m in found if m.group() not in known]
        offsets = run.layout.response_offsets
        flag = np.zeros(offsets.shape[0], dtype=np.float32)
        for m in absent:
            flag[(offsets[:, 0] < m.end()) & (m.start() < offsets[:, 1])] = 1.0
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=("share_absent_numbers", "n_numbers"),
            response=np.asarray(
                [len(absent) / len(found) if found else 0.0, len(found)], dtype=np.float32
            ),
            token_names=("absent_number",),
            tokens=flag[:, None],
            token_offsets=offsets,
        )


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> type[ToyNumbersDetector]:
    """The toy registered as the registry's list would register it (undone after)."""
    for registry in (MEMBERS, DETECTORS):
        monkeypatch.setitem(registry._classes, TOY, ToyNumbersDetector)
    return ToyNumbersDetector


@pytest.fixture
def toy_set(toy, tiny_model, tmp_path: Path) -> Path:
    """A detectors folder: the toy and nll, fitted on the demo examples."""
    examples = builtin_examples()
    dets = [make_detector(TOY), make_detector("nll")]
    feats = extract_features(tiny_model, examples, dets).features
    for d in dets:
        d.fit(list(feats[d.name]), examples).save(tmp_path / "set" / d.name)
    return tmp_path / "set"


def test_a_registered_detector_is_a_default_member_and_runnable(toy, tiny_model) -> None:
    assert make_detector("ensemble").config.members[-1] == TOY
    assert TOY in available_detectors() and TOY in runnable_detectors(tiny_model)
    # The ensemble itself is not stacked; every landed detector is.
    assert "ensemble" not in make_detector("ensemble").config.members
    assert len(make_detector("ensemble").config.members) == len(MEMBERS.names())


def test_the_report_draws_a_new_detector_by_its_traits(toy_set: Path, tiny_model) -> None:
    dets = {n: DETECTORS.get(n).load(toy_set / n) for n in (TOY, "nll")}
    ex = builtin_examples()[0]
    feats = run_example(tiny_model, ex, list(dets.values()))
    verdicts = {n: d.predict(feats[n]) for n, d in dets.items()}
    page = answer_report_html(
        example=ex,
        model_name="tiny",
        verdicts=verdicts,
        detectors=dets,
        features=feats,
    )
    box = page[page.index(f"id='det-{TOY}'") :]
    box = box[: box.index("</div>", box.index("Plotly.newPlot"))]
    # Contributions are drawn as bars of the log-odds, not as a table of values.
    assert "share_absent_numbers" in box and "What the score was read from" not in box
    assert f"<td>{TOY}</td><td>{verdicts[TOY].score:.3f}</td>" in page


def test_the_playground_and_the_pages_that_list_detectors_show_a_new_one(
    toy_set: Path, make_app, monkeypatch: pytest.MonkeyPatch, no_exception
) -> None:
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(toy_set))
    at = make_app().run()
    at.switch_page("views/playground.py").run()
    at.selectbox(key=KEY_EXAMPLE).select(builtin_examples()[0].id).run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.button(key=KEY_ANALYSE).click().run()
    no_exception(at)
    table = next(t.value for t in at.table if "verdict" in t.value.columns)
    assert TOY in list(table["detector"]), table
    at.switch_page("views/agreement.py").run()
    no_exception(at)
    assert TOY in at.multiselect[0].options
