"""The Mitigation page on the tiny model (AppTest): feedback regeneration re-scored by
every detector, AARF's missing detector named, SAE steering continuations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.state.mitigation import (
    KEY_EXAMPLE,
    KEY_FEEDBACK,
    KEY_GUIDE,
    KEY_METHOD,
    KEY_STEER,
    KEY_TEMPERATURE,
    KEY_VALUES,
)
from app.state.session import STATE_KEY
from core.data import builtin_examples
from core.engine.model import LoadedModel
from core.interventions.counterfactual import on_template
from core.interventions.mitigate import INSTANCE_FEEDBACK, answer_change
from core.interventions.steer import steer_continuation
from core.pipeline.judge import judge
from core.pipeline.sets import load_set

PAGE = "views/mitigation.py"
EXAMPLE = "demo-04-mount-kelsey"


@pytest.fixture
def page(
    with_demo_detectors: Path,
    tiny_sae,
    monkeypatch: pytest.MonkeyPatch,
    open_page: Callable[[str], AppTest],
) -> AppTest:
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    at = open_page(PAGE)
    at.selectbox(key=KEY_EXAMPLE).select(EXAMPLE).run()
    return at


def _example():
    return next(e for e in builtin_examples() if e.id == EXAMPLE)


def test_feedback_regenerates_and_rescores(
    page: AppTest,
    no_exception: Callable[[AppTest], None],
    tiny_model: LoadedModel,
    spy_heights: Callable[[], list[object]],
) -> None:
    page.selectbox(key=KEY_GUIDE).select("context_gain").run()
    assert any("Feedback turn sent" in m.value for m in page.markdown)
    assert any("Estimated time on this machine" in c.value for c in page.caption)
    page.number_input(key=KEY_TEMPERATURE).set_value(1.0).run()
    heights = spy_heights()
    page.button(key=KEY_FEEDBACK).click().run()
    no_exception(page)
    method, ex_id, text, _, turn = page.session_state[STATE_KEY].mit.result
    assert method == "feedback" and ex_id == EXAMPLE and text.strip()
    # What was sent is said, and whether the answer changed.
    assert turn.asked == "token" and turn.sent in ("token", "instance")
    change = answer_change(_example().response, text)
    if change.identical:
        assert any("identical to the first" in i.value for i in page.info)
    else:
        assert any(change.describe() in c.value for c in page.caption)
    frame = page.dataframe[0].value
    assert heights[0] == "content"  # every detector shown, no inner scrollbar
    want = judge(tiny_model, _example(), load_set(tiny_model.info.key))
    for name in ("nll", "context_gain"):
        row = frame[frame["detector"] == name].iloc[0]
        assert row["original"] == pytest.approx(want.verdicts[name].score, abs=1e-6)
        assert 0.0 <= row["after feedback"] <= 1.0
    assert frame["detector"].iloc[0] == f"overall ({want.judge})"
    assert any("rs-answer-diff" in h.value for h in page.html)


def test_token_feedback_with_nothing_flagged_says_it_falls_back(
    monkeypatch: pytest.MonkeyPatch, page: AppTest
) -> None:
    # A token detector that flags no span: the page says the instance message is sent.
    # (The page's script imports flagged_spans from core.signals.smoothing at each run.)
    monkeypatch.setattr("core.signals.smoothing.flagged_spans", lambda *a, **k: [])
    page.selectbox(key=KEY_GUIDE).select("context_gain").run()
    assert any("nothing to quote" in w.value for w in page.warning)
    assert any(
        "(instance level)" in m.value and "supported by the passages" in m.value
        for m in page.markdown
    )
    assert INSTANCE_FEEDBACK.startswith("Your answer may contain")


def test_greedy_blank_answer_is_a_clear_error(page: AppTest) -> None:
    page.button(key=KEY_FEEDBACK).click().run()
    assert any("empty answer" in e.value for e in page.error)
    assert page.session_state[STATE_KEY].mit.result is None


def test_aarf_names_the_missing_detector(page: AppTest, page_text) -> None:
    page.radio(key=KEY_METHOD).set_value("aarf").run()
    assert "--detectors redeep_token" in page_text(page)


def test_steering_shows_one_continuation_per_value(
    page: AppTest, no_exception: Callable[[AppTest], None], tiny_model: LoadedModel, tiny_sae
) -> None:
    page.radio(key=KEY_METHOD).set_value("steer").run()
    page.text_input(key=KEY_VALUES).input("-200, 200").run()
    page.button(key=KEY_STEER).click().run()
    no_exception(page)
    method, _, runs, _, *_ = page.session_state[STATE_KEY].mit.result
    assert method == "steer" and [r.value for r in runs] == [None, -200.0, 200.0]
    ref = steer_continuation(
        tiny_model,
        tiny_sae,
        on_template(_example()),
        feature=runs[1].feature,
        position=runs[1].position,
        value=200.0,
        max_new_tokens=48,
    )
    assert runs[2].token_ids == ref.token_ids
    assert any("F" in m.value and "= 200" in m.value for m in page.markdown)
