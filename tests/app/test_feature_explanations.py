"""The Feature explanations page (AppTest) on the tiny model with the small ``tiny_sae``.

No shipped raglens detector (features are typed in or the most active ones); the
explainer is unset, or the fake OpenAI-compatible server of ``llm_server``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from app.state.features import (
    KEY_EXPLAIN_FEATURES,
    KEY_EXPLAIN_IDS,
    KEY_EXPLAIN_READ,
    KEY_EXPLAIN_RUN,
    KEY_EXPLAIN_SOURCE,
    KEY_EXPLAIN_TOP_N,
    explain_one_key,
    fidelity_key,
)
from app.state.heads import HEADS_FROM_CORPUS, HEADS_FROM_HOME
from app.state.session import STATE_KEY
from core.base.llm import SETTING_NAMES
from core.data import load_builtin
from core.explain import PromptBudget, build_prompt, feature_examples, feature_key
from core.storage import Store

PAGE = "views/feature_explanations.py"
CACHED = "Hallucination: yes - made-up dates\nDescription: Fires on dates no passage gives."
ASKED = "Hallucination: no - copied wording\nDescription: Fires on words copied from a passage."


@pytest.fixture
def sae_env(app_env: Path, tiny_sae, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny SAE as the shipped one, and no explainer settings; returns the DB."""
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    for name in SETTING_NAMES:
        monkeypatch.delenv(name, raising=False)
    return app_env


def _corpus(at: AppTest) -> AppTest:
    """Read the built-in labelled corpus (the page opens on Home's dataset, the demo)."""
    assert at.selectbox(key=KEY_EXPLAIN_SOURCE).value == HEADS_FROM_HOME
    at.selectbox(key=KEY_EXPLAIN_SOURCE).set_value(HEADS_FROM_CORPUS).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _read(at: AppTest) -> AppTest:
    at.button(key=KEY_EXPLAIN_READ).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _request_examples(at: AppTest):
    req = at.session_state[STATE_KEY].explain.request
    assert req is not None and req.ids
    by_id = {e.id: e for e in load_builtin()}
    return req, [by_id[i] for i in req.ids]


def _firing_feature(tiny_model, tiny_sae, examples) -> int:
    return next(
        k
        for k in range(tiny_sae.d_sae)
        if feature_examples(tiny_model, tiny_sae, examples, k).n_firing >= 3
    )


def _completion(content: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
        },
    )


def test_without_an_endpoint_the_page_says_how_to_configure_one(
    sae_env: Path,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
    settled: Callable[[AppTest], AppTest],
) -> None:
    at = settled(open_page(PAGE))  # its estimate's timing runs in the background
    # Before the read: how long it will take here, paced on one answer read (and kept);
    # the page opens on the dataset picked on Home (the demo's 12 answers).
    said = [c.value for c in at.caption if c.value.startswith("Estimated time on this machine")]
    assert len(said) == 1 and "11 of 12 answers to trace" in said[0], said
    assert "1 already in this server's memory" in said[0]
    at = _corpus(at)
    text = page_text(at)
    assert "No LLM endpoint is configured" in text
    for name in ("RAGSCOPE_LLM_MODEL", "RAGSCOPE_LLM_BASE_URL", "RAGSCOPE_LLM_API_KEY"):
        assert f"`{name}`" in text
    assert ".streamlit/secrets.toml" in text
    assert any("RAGSCOPE_LLM_MODEL =" in c.value for c in at.code)
    # no raglens detector: the command that makes one
    assert "ragscope train --model tiny --dataset builtin --seed 0 --detectors raglens" in text
    said = [c.value for c in at.caption if c.value.startswith("Estimated time on this machine")]
    assert len(said) == 1 and "48 of 48 answers to trace" in said[0], said
    _read(at)
    no_exception(at)
    assert not any(c.value.startswith("Estimated time") for c in at.caption)
    with Store(sae_env) as db:  # the time the page took to show the read, per answer
        shown = db._query("SELECT seconds_per_char FROM paces WHERE detectors LIKE ?", ("%|shown",))
    assert len(shown) == 1 and shown[0][0] > 0
    assert at.button(key=KEY_EXPLAIN_RUN).disabled
    cards = [m.value for m in at.markdown if m.value.startswith("#### F")]
    assert 1 <= len(cards) <= 8
    k = int(cards[0].removeprefix("#### F"))
    assert at.button(key=explain_one_key(k)).disabled
    assert at.button(key=fidelity_key(k)).disabled
    assert "No explanation cached for these examples yet." in page_text(at)
    assert any('class="rs-heatmap"' in h.value for h in at.html)


def test_without_an_sae_the_page_names_the_command(
    sae_env: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
) -> None:
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tmp_path / "no-sae"))
    at = open_page(PAGE)
    text = page_text(at)
    assert "No SAE for" in text and "`ragscope sae train --model tiny --out" in text
    assert "--detectors raglens" in text
    assert not any(b.key == KEY_EXPLAIN_READ for b in at.button)


def test_a_cached_explanation_is_shown_without_an_endpoint(
    sae_env: Path,
    tiny_model,
    tiny_sae,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    at = _read(_corpus(open_page(PAGE)))
    req, examples = _request_examples(at)
    k = _firing_feature(tiny_model, tiny_sae, examples)
    fx = feature_examples(tiny_model, tiny_sae, examples, k, activation=req.activation)
    with Store(sae_env) as db:
        db.put_explanation(
            model=tiny_model.info.key,
            feature_key=feature_key(tiny_sae.key, k),
            prompt_hash=build_prompt(fx).hash,
            text=CACHED,
        )
    at.text_input(key=KEY_EXPLAIN_IDS).input(str(k)).run()
    no_exception(at)
    text = page_text(at)
    assert f"#### F{k}" in text
    assert "**Explanation:** Fires on dates no passage gives." in text
    assert "Related to hallucination: **yes** — made-up dates" in text
    assert "No LLM endpoint is configured" in text
    assert at.button(key=explain_one_key(k)).disabled


def test_explain_top_n_and_fidelity_with_a_fake_endpoint(
    sae_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    llm_server,
    llm_base_url: str,
    tiny_model,
    tiny_sae,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    monkeypatch.setenv("RAGSCOPE_LLM_BASE_URL", llm_base_url)
    monkeypatch.setenv("RAGSCOPE_LLM_MODEL", "fake-explainer")
    monkeypatch.setenv("RAGSCOPE_LLM_API_KEY", "sk-app-test-secret")
    asked: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        user = json.loads(request.content)["messages"][1]["content"]
        asked.append(user)
        return _completion("Answer 1: 0=5\nAnswer 2: none" if "numbered tokens" in user else ASKED)

    route = llm_server.post("/chat/completions").mock(side_effect=reply)
    at = _corpus(open_page(PAGE))
    assert "Explainer: `fake-explainer`" in page_text(at)
    assert "context not stated: prompts go whole" in page_text(at)  # /models not routed
    assert "sk-app-test-secret" not in page_text(at)
    _read(at)
    req, examples = _request_examples(at)
    k = _firing_feature(tiny_model, tiny_sae, examples)
    at.text_input(key=KEY_EXPLAIN_IDS).input(f"{k}").run()
    at.number_input(key=KEY_EXPLAIN_TOP_N).set_value(1).run()
    at.button(key=KEY_EXPLAIN_RUN).click().run()
    no_exception(at)
    assert route.call_count == 1
    assert [s.value for s in at.success] == ["1 of 1 features explained · 1 asked, 0 cached."]
    assert "**Explanation:** Fires on words copied from a passage." in page_text(at)
    fx = feature_examples(tiny_model, tiny_sae, examples, k, activation=req.activation)
    assert asked[0] == build_prompt(fx).user
    with Store(sae_env) as db:
        assert (
            db.get_explanation(
                model=tiny_model.info.key,
                feature_key=feature_key(tiny_sae.key, k),
                prompt_hash=build_prompt(fx).hash,
            )
            == ASKED
        )
    at.button(key=fidelity_key(k)).click().run()
    no_exception(at)
    assert route.call_count == 2
    assert "Fires on words copied from a passage." in asked[1]
    assert "**Fidelity:** Pearson r = " in page_text(at)


def test_a_small_explainer_gets_prompts_fitted_to_the_context_its_server_states(
    sae_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    llm_server,
    llm_base_url: str,
    tiny_model,
    tiny_sae,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    monkeypatch.setenv("RAGSCOPE_LLM_BASE_URL", llm_base_url)
    monkeypatch.setenv("RAGSCOPE_LLM_MODEL", "small-explainer")
    listing = {"object": "list", "data": [{"id": "small-explainer", "max_model_len": 2048}]}
    llm_server.get("/models").mock(return_value=httpx.Response(200, json=listing))
    asked: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content)["messages"][1]["content"])
        return _completion(ASKED)

    llm_server.post("/chat/completions").mock(side_effect=reply)
    at = _corpus(open_page(PAGE))
    assert "context 2,048 tokens (from its server's model list)" in page_text(at)
    _read(at)
    req, examples = _request_examples(at)
    k = _firing_feature(tiny_model, tiny_sae, examples)
    at.text_input(key=KEY_EXPLAIN_IDS).input(f"{k}").run()
    at.button(key=explain_one_key(k)).click().run()
    no_exception(at)
    fx = feature_examples(tiny_model, tiny_sae, examples, k, activation=req.activation)
    tok = tiny_model.tokenizer
    budget = PromptBudget(
        context=2048, count=lambda t: len(tok(t, add_special_tokens=False)["input_ids"])
    )
    fitted = build_prompt(fx, budget=budget)
    assert asked == [fitted.user] and fitted.user != build_prompt(fx).user
    assert fitted.n_tokens <= 2048 - budget.reserve - budget.overhead
    assert "**Explanation:** Fires on words copied from a passage." in page_text(at)
    assert f"written from {fitted.n_shown} of the {len(fx.shown)} answers" in page_text(at)
    assert at.button(key=explain_one_key(k)).disabled  # this explainer's prompt is cached

    # A roomier explainer offers to explain again from the whole prompt.
    monkeypatch.setenv("RAGSCOPE_LLM_CONTEXT", "100000")
    at.run()
    no_exception(at)
    assert "context 100,000 tokens (from `RAGSCOPE_LLM_CONTEXT`)" in page_text(at)
    again = at.button(key=explain_one_key(k))
    assert again.label == "Explain from more answers" and not again.disabled
    again.click().run()
    assert asked[-1] == build_prompt(fx).user and len(asked) == 2
    assert f"written from {len(fx.shown)} of the {len(fx.shown)} answers" in page_text(at)


def test_a_shipped_raglens_detector_ranks_the_features(
    sae_env: Path,
    tiny_model,
    tiny_sae,
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    import os

    from core.data import resolve_dataset
    from core.detectors import make_detector
    from core.pipeline.extract import extract_features

    builtin = resolve_dataset("builtin")[1]
    train = [e for e in builtin if e.label][:12] + [e for e in builtin if e.label is False][:12]
    det = make_detector("raglens", sae=str(tiny_sae.path), top_k=10, max_rounds=100)
    det.fit(list(extract_features(tiny_model, train, [det]).features["raglens"]), train)
    det.save(Path(os.environ["RAGSCOPE_DETECTORS_DIR"]) / "raglens")
    ranked = [k for k, _ in det.importances()]

    at = _corpus(open_page(PAGE))
    assert "No trained **raglens** detector" not in page_text(at)
    picker = at.multiselect(key=KEY_EXPLAIN_FEATURES)
    assert picker.value == ranked[:8]
    assert picker.options[0].startswith(f"F{ranked[0]} · #1 (importance ")
    _read(at)
    no_exception(at)
    cards = [m.value for m in at.markdown if m.value.startswith("#### F")]
    assert cards == [f"#### F{k}" for k in ranked[:8]]
    assert "raglens #1 · fires on" in page_text(at)
