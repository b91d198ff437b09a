"""LLM-written SAE feature explanations: examples, prompt, cache, endpoint, fidelity.

The tiny model with the small trained ``tiny_sae``; the explainer is a fake
OpenAI-compatible server (respx, ``llm_server``): no request leaves the machine.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.stats import pearsonr

import core.explain as explain
import core.explain.activations as explain_activations
import core.explain.prompt as explain_prompt
from core.base.errors import DataError, LLMError
from core.base.llm import LLMEndpoint, probe_context
from core.data import resolve_dataset
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.explain import (
    BatchResult,
    Explanation,
    FeatureExample,
    FeatureExamples,
    PromptBudget,
    active_features,
    build_prompt,
    cached_explanation,
    clear_activation_cache,
    encode_answers,
    explain_feature,
    explain_many,
    feature_examples,
    fidelity,
    parse_predictions,
    prompt_layouts,
    read_estimate,
    time_reading,
)
from core.pipeline.extract import example_chars
from core.storage import Store

KEY = "sk-test-DO-NOT-LEAK-5f1c9a7e"
CHAT = "/chat/completions"
REPLY = "Hallucination: yes - invented years\nDescription: Fires on years the passages lack."
N_TOP, N_QUANTILE, N_HELD_OUT = 4, 4, 4


def completion(content: str | None, finish: str = "stop") -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "fake-explainer",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "message": {"role": "assistant", "content": content},
                }
            ],
        },
    )


@pytest.fixture
def endpoint(llm_base_url: str) -> LLMEndpoint:
    return LLMEndpoint(model="fake-explainer", base_url=llm_base_url, api_key=KEY, max_retries=0)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    db = tmp_path / "explain.sqlite3"
    monkeypatch.setenv("RAGSCOPE_DB", str(db))
    with Store(db) as s:
        yield s


@pytest.fixture(scope="module")
def examples():
    return resolve_dataset("builtin")[1][:24]


@pytest.fixture(scope="module")
def reference(tiny_model, tiny_sae, examples, one_torch_thread):
    """Per example: answer tokens and ``[T, d_sae]`` activations, read through the trace
    engine (independent of :func:`core.engine.trace.residuals_until`)."""
    out = []
    for ex in examples:
        layout = render(ex, tiny_model)
        tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[1], positions="response"))
        z = tiny_sae.encode(tr.at("resid_post", 1, layout.response_positions), "post").numpy()
        out.append((ex.id, layout.response_token_strings(), z))
    return out


@pytest.fixture(scope="module")
def feature(reference) -> int:
    """A feature that fires on enough answers for top, quantile and held-out groups."""
    maxes = np.stack([z.max(0) for _, _, z in reference])
    n_firing = (maxes > 0).sum(0)
    ok = np.flatnonzero((n_firing >= N_TOP + N_QUANTILE + 2) & (n_firing <= len(reference) - 2))
    assert ok.size, "the tiny SAE has no feature firing on most but not all answers"
    return int(ok[0])


@pytest.fixture(scope="module")
def fx(tiny_model, tiny_sae, examples, feature, one_torch_thread) -> FeatureExamples:
    clear_activation_cache()
    return feature_examples(
        tiny_model,
        tiny_sae,
        examples,
        feature,
        n_top=N_TOP,
        n_quantile=N_QUANTILE,
        n_held_out=N_HELD_OUT,
    )


# --------------------------------------------------------------------------- examples


def test_activations_match_an_independent_trace(fx, reference, feature):
    ref = {ex_id: (toks, z[:, feature]) for ex_id, toks, z in reference}
    assert fx.example_ids == tuple(ex_id for ex_id, _, _ in reference)
    for ex in fx.shown + fx.held_out:
        toks, acts = ref[ex.example_id]
        assert ex.tokens == toks
        np.testing.assert_allclose(ex.activations, acts, rtol=1e-5, atol=1e-6)
        assert ex.max_activation == pytest.approx(float(acts.max()))
    np.testing.assert_allclose(
        fx.max_activations, [z[:, feature].max() for _, _, z in reference], rtol=1e-5, atol=1e-6
    )


def test_pre_activations_are_cached_apart_from_post(tiny_model, tiny_sae, examples, feature):
    few = examples[:3]
    post = feature_examples(tiny_model, tiny_sae, few, feature, activation="post")
    pre = feature_examples(tiny_model, tiny_sae, few, feature, activation="pre")
    for ex in few:
        layout = render(ex, tiny_model)
        tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[1], positions="response"))
        x = tr.at("resid_post", 1, layout.response_positions)
        i = pre.example_ids.index(ex.id)
        assert pre.max_activations[i] == pytest.approx(
            float(tiny_sae.encode(x, "pre")[:, feature].max()), rel=1e-5, abs=1e-6
        )
    assert (pre.max_activations >= post.max_activations - 1e-6).all()
    assert not np.allclose(pre.max_activations, post.max_activations)


def test_top_examples_are_the_top_by_max_activation(fx, reference, feature):
    maxes = {ex_id: float(z[:, feature].max()) for ex_id, _, z in reference}
    top_ids = [e.example_id for e in fx.top]
    assert len(top_ids) == N_TOP
    expected = sorted(maxes.values(), reverse=True)[:N_TOP]
    np.testing.assert_allclose([maxes[i] for i in top_ids], expected, rtol=1e-6)
    others = [v for k, v in maxes.items() if k not in top_ids]
    assert min(maxes[i] for i in top_ids) >= max(others)
    # quantile sample: firing, not in the top, one from each equal-count bin of the rest
    rest = sorted((v, k) for k, v in maxes.items() if v > 0 and k not in top_ids)
    bins = [{k for _, k in b} for b in np.array_split(np.array(rest, dtype=object), N_QUANTILE)]
    q_ids = [e.example_id for e in fx.quantile]
    assert len(q_ids) == N_QUANTILE
    assert all(maxes[i] > 0 for i in q_ids) and not set(q_ids) & set(top_ids)
    assert sorted(next(b for b, s in enumerate(bins) if i in s) for i in q_ids) == list(
        range(N_QUANTILE)
    )
    assert [e.max_activation for e in fx.quantile] == sorted(
        (e.max_activation for e in fx.quantile), reverse=True
    )
    held = [e.example_id for e in fx.held_out]
    assert len(held) == N_HELD_OUT and not set(held) & set(top_ids + q_ids)
    assert any(maxes[i] > 0 for i in held) and any(maxes[i] == 0 for i in held)


def test_encoded_answers_are_cached_across_features(
    fx, tiny_model, tiny_sae, examples, feature, monkeypatch
):
    def no_forward(*args, **kwargs):
        raise AssertionError("a forward pass ran although the answers were cached")

    monkeypatch.setattr(explain_activations, "residuals_until", no_forward)
    other = feature_examples(tiny_model, tiny_sae, examples, (feature + 1) % tiny_sae.d_sae)
    assert other.n_examples == len(examples)
    clear_activation_cache()
    with pytest.raises(AssertionError, match="forward pass"):
        feature_examples(tiny_model, tiny_sae, examples[:1], feature)


def test_token_activations_dropped_from_memory_are_read_again(
    tiny_model, tiny_sae, examples, feature, reference, monkeypatch
):
    clear_activation_cache()
    # keeps only the last answer
    monkeypatch.setattr(explain_activations._tokens_cache, "max_bytes", 1)
    encode_answers(tiny_model, tiny_sae, examples)
    real = explain_activations.residuals_until
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(explain_activations, "residuals_until", counting)
    assert active_features(tiny_model, tiny_sae, examples, n=3)
    assert not calls  # the per-feature maxima stayed cached
    again = feature_examples(
        tiny_model, tiny_sae, examples, feature, n_top=N_TOP, n_quantile=N_QUANTILE, n_held_out=0
    )
    assert 0 < len(calls) <= len(again.shown)
    ref = {ex_id: z[:, feature] for ex_id, _, z in reference}
    for ex in again.shown:
        np.testing.assert_allclose(ex.activations, ref[ex.example_id], rtol=1e-5, atol=1e-6)
    clear_activation_cache()


def test_encode_answers_counts_reads_and_skips_failures(
    tiny_model, tiny_sae, examples, monkeypatch
):
    import core.engine.layout

    real = core.engine.layout.render

    def render(example, model, **kwargs):
        if example.id == examples[1].id:
            raise DataError("too long for the model", source=example.id)
        return real(example, model, **kwargs)

    clear_activation_cache()
    first = encode_answers(tiny_model, tiny_sae, examples[:2])
    assert (first.computed, first.cache_hits, len(first.examples)) == (2, 0, 2)
    clear_activation_cache()
    encode_answers(tiny_model, tiny_sae, examples[:1])
    monkeypatch.setattr(explain_activations, "render", render)
    seen = []
    got = encode_answers(
        tiny_model, tiny_sae, examples[:3], on_error="skip", progress=lambda d, t: seen.append(d)
    )
    assert [e.id for e in got.examples] == [examples[0].id, examples[2].id]
    assert (got.cache_hits, got.computed) == (1, 1)
    assert len(got.errors) == 1 and got.errors[0].startswith(examples[1].id)
    assert seen == [1, 2, 3]
    with pytest.raises(DataError, match="too long"):
        encode_answers(tiny_model, tiny_sae, examples[:3])


def test_active_features_fire_on_the_most_answers(tiny_model, tiny_sae, examples, reference):
    count = (np.stack([z.max(0) for _, _, z in reference]) > 0).sum(0)
    got = active_features(tiny_model, tiny_sae, examples, n=5)
    assert len(got) == 5
    np.testing.assert_array_equal(count[got], np.sort(count)[::-1][:5])


def test_feature_outside_the_sae_is_refused(tiny_model, tiny_sae, examples):
    with pytest.raises(ValueError, match=str(tiny_sae.d_sae)):
        feature_examples(tiny_model, tiny_sae, examples[:1], tiny_sae.d_sae)


# --------------------------------------------------------------------------- prompt


def test_prompt_lists_every_token_with_its_scaled_activation(fx):
    prompt = build_prompt(fx, window=None)
    top = max(e.max_activation for e in fx.shown)
    for ex in fx.shown:
        for tok, a in zip(ex.tokens, ex.activations, strict=True):
            level = int(np.clip(np.rint(10 * a / top), 0, 10))
            assert f"({json.dumps(tok, ensure_ascii=False)}, {level})" in prompt.user
    assert prompt.user.count("Answer ") == len(fx.shown)
    assert "hallucination" in prompt.user.lower() and "one sentence" in prompt.user
    assert "(token, activation)" in prompt.user


def test_prompt_window_keeps_the_peak(fx):
    ex = max(fx.shown, key=lambda e: len(e.tokens))
    assert len(ex.tokens) > 6
    prompt = build_prompt(fx, window=6)
    block = prompt.user.split(f"Answer {fx.shown.index(ex) + 1} [")[1].split("\n")[1]
    assert block.count('", ') == 6
    assert json.dumps(ex.tokens[ex.peak], ensure_ascii=False) in block
    assert f"of {len(ex.tokens)})" in prompt.user


def test_prompt_hash_follows_version_and_examples(fx, tiny_model, tiny_sae, examples, monkeypatch):
    a = build_prompt(fx).hash
    assert build_prompt(fx).hash == a
    fewer = FeatureExamples(
        feature=fx.feature,
        sae_key=fx.sae_key,
        activation=fx.activation,
        top=fx.top[:-1],
        quantile=fx.quantile,
        held_out=fx.held_out,
        example_ids=fx.example_ids,
        max_activations=fx.max_activations,
    )
    assert build_prompt(fewer).hash != a
    monkeypatch.setattr(explain_prompt, "PROMPT_VERSION", "ragscope-explain-v999")
    assert build_prompt(fx).hash != a


def test_a_silent_feature_has_nothing_to_explain():
    ex = FeatureExample(
        example_id="e", tokens=("a",), activations=np.zeros(1, np.float32), max_activation=0.0
    )
    fx = FeatureExamples(
        feature=3,
        sae_key="s",
        activation="post",
        top=(),
        quantile=(),
        held_out=(ex,),
        example_ids=("e",),
        max_activations=np.zeros(1, np.float32),
    )
    with pytest.raises(DataError, match="fires on none"):
        build_prompt(fx)


# --------------------------------------------------------------------------- prompt budget


def test_layouts_narrow_the_windows_then_drop_answers_in_proportion():
    got = prompt_layouts(12, 12, 64)
    assert got[:4] == [(12, 12, 64), (12, 12, 48), (12, 12, 32), (12, 12, 24)]
    assert got[4] == (12, 11, 24) and got[5] == (11, 11, 24)
    assert got[-3:] == [(1, 1, 24), (1, 1, 16), (1, 1, 8)]
    shown = [kt + ks for kt, ks, _ in got]
    assert shown == sorted(shown, reverse=True) and len(set(got)) == len(got)
    assert all(kt >= 1 for kt, _, _ in got)
    assert prompt_layouts(3, 0, None)[:4] == [(3, 0, None), (3, 0, 48), (3, 0, 32), (3, 0, 24)]


def _chars(text: str) -> int:
    return len(text)


def test_a_budget_gets_the_largest_prompt_that_fits(fx):
    full = build_prompt(fx)
    assert full.n_tokens is None and (full.n_top, full.n_spread) == (N_TOP, N_QUANTILE)
    roomy = PromptBudget(context=10**7, count=_chars)
    assert build_prompt(fx, budget=roomy).hash == full.hash
    layouts = explain_prompt._candidates(fx, explain.DEFAULT_WINDOW)
    sizes = [len(p.system) + len(p.user) for p in layouts]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] / 2
    # a context that holds about the middle layout, not the full one
    mid = sizes[len(sizes) // 2]
    budget = PromptBudget(context=mid + 400, count=_chars, margin=1.0)
    got = build_prompt(fx, budget=budget)
    assert got.n_tokens == len(got.system) + len(got.user) <= budget.limit
    i = [p.hash for p in layouts].index(got.hash)
    assert i > 0 and sizes[i - 1] > budget.limit  # the next larger one does not fit
    assert got.n_shown < full.n_shown or (got.window or 0) < (full.window or 10**9)
    assert f"'strongest' ({got.n_top})" in got.user and f"'spread' ({got.n_spread})" in got.user
    assert got.user.count("Answer ") == got.n_shown
    # the margin counts too: 10% more per counted token needs a smaller layout
    tighter = build_prompt(fx, budget=PromptBudget(context=mid + 400, count=_chars, margin=1.5))
    assert len(tighter.user) < len(got.user)


def test_too_small_a_context_is_a_clear_error(fx):
    with pytest.raises(DataError, match="RAGSCOPE_LLM_CONTEXT"):
        build_prompt(fx, budget=PromptBudget(context=1024, count=lambda t: 50 * len(t)))
    with pytest.raises(DataError, match="at least 1024"):
        PromptBudget(context=512)


def test_a_fitted_explanation_is_cached_and_found_without_the_explainer(
    endpoint, store, fx, llm_server
):
    route = llm_server.post(CHAT).mock(return_value=completion(REPLY))
    sizes = [
        len(p.system) + len(p.user) for p in explain_prompt._candidates(fx, explain.DEFAULT_WINDOW)
    ]
    budget = PromptBudget(context=sizes[-1] + 400, count=_chars, margin=1.0)
    small = explain_feature(endpoint, "m", fx.sae_key, fx.feature, fx, store=store, budget=budget)
    sent = json.loads(route.calls.last.request.content)["messages"][1]["content"]
    assert sent == small.prompt.user and small.prompt.n_tokens <= budget.limit
    assert small.prompt.n_shown < len(fx.shown)
    # with no explainer, any cached layout of these examples shows (with its layout)
    found = cached_explanation("m", fx, store=store)
    assert found is not None and found.prompt_hash == small.prompt_hash and found.text == REPLY
    assert found.prompt.n_shown == small.prompt.n_shown
    assert explain_feature(None, "m", fx.sae_key, fx.feature, fx, store=store).cached
    # an explainer with room for the whole prompt asks again (more evidence), once
    big = explain_feature(endpoint, "m", fx.sae_key, fx.feature, fx, store=store)
    assert route.call_count == 2 and not big.cached and big.prompt.n_shown == len(fx.shown)
    assert cached_explanation("m", fx, store=store).prompt_hash == big.prompt_hash  # largest
    assert explain_feature(endpoint, "m", fx.sae_key, fx.feature, fx, store=store).cached
    assert route.call_count == 2


def test_store_finds_the_first_cached_of_several_prompts(store):
    store.put_explanation(model="m", feature_key="s:F1", prompt_hash="b", text="B")
    store.put_explanation(model="m", feature_key="s:F1", prompt_hash="c", text="C")
    store.put_explanation(model="m", feature_key="s:F2", prompt_hash="a", text="other feature")
    assert store.find_explanation(model="m", feature_key="s:F1", prompt_hashes=["a", "c", "b"]) == (
        "c",
        "C",
    )
    assert store.find_explanation(model="m", feature_key="s:F1", prompt_hashes=["a"]) is None
    assert store.find_explanation(model="m", feature_key="s:F1", prompt_hashes=[]) is None
    assert store.find_explanation(model="x", feature_key="s:F1", prompt_hashes=["b"]) is None


def test_the_context_is_read_from_the_settings_or_the_server(llm_server, llm_base_url):
    base = {"RAGSCOPE_LLM_MODEL": "fake-explainer", "RAGSCOPE_LLM_BASE_URL": llm_base_url}
    assert LLMEndpoint.resolve(env=base).context is None
    got = LLMEndpoint.resolve(env=base, secrets={"RAGSCOPE_LLM_CONTEXT": "8192"})
    assert got.context == 8192 and "context=8192" in repr(got)
    for bad, match in (("8k", "whole number"), ("100", "at least 1024")):
        with pytest.raises(DataError, match=match):
            LLMEndpoint.resolve(env={**base, "RAGSCOPE_LLM_CONTEXT": bad})
    listing = {
        "object": "list",
        "data": [
            {"id": "other", "object": "model", "max_model_len": 4096},
            {"id": "fake-explainer", "object": "model", "max_model_len": 8192},
        ],
    }
    route = llm_server.get("/models").mock(return_value=httpx.Response(200, json=listing))
    endpoint = LLMEndpoint(model="fake-explainer", base_url=llm_base_url)
    assert probe_context(endpoint) == 8192
    listing["data"][1] = {"id": "fake-explainer", "object": "model", "context_length": 32768}
    route.mock(return_value=httpx.Response(200, json=listing))
    assert probe_context(endpoint) == 32768
    listing["data"][1] = {"id": "fake-explainer", "object": "model"}  # not stated
    route.mock(return_value=httpx.Response(200, json=listing))
    assert probe_context(endpoint) is None
    route.mock(return_value=httpx.Response(500, json={"error": {"message": "down"}}))
    assert probe_context(endpoint) is None  # never raises
    n = route.call_count
    assert probe_context(LLMEndpoint(model="gpt", api_key=KEY)) is None  # api.openai.com
    assert route.call_count == n


# --------------------------------------------------------------------------- endpoint


def test_endpoint_resolves_from_env_then_secrets():
    assert LLMEndpoint.resolve(env={}, secrets={}) is None
    assert LLMEndpoint.resolve(env={"RAGSCOPE_LLM_MODEL": "m"}, secrets={}) is None
    e = LLMEndpoint.resolve(
        env={"RAGSCOPE_LLM_MODEL": "m", "OPENAI_API_KEY": KEY},
        secrets={"RAGSCOPE_LLM_MODEL": "other", "RAGSCOPE_LLM_BASE_URL": "http://h:1/v1"},
    )
    assert (e.model, e.base_url, e.api_key) == ("m", "http://h:1/v1", KEY)
    e = LLMEndpoint.resolve(
        env={"OPENAI_API_KEY": "fallback"},
        secrets={"RAGSCOPE_LLM_MODEL": "s", "RAGSCOPE_LLM_API_KEY": KEY},
    )
    assert (e.model, e.base_url, e.api_key) == ("s", None, KEY)
    assert LLMEndpoint.missing(env={}, secrets={}) == [
        "RAGSCOPE_LLM_MODEL",
        "RAGSCOPE_LLM_BASE_URL or RAGSCOPE_LLM_API_KEY",
    ]
    assert LLMEndpoint.missing(env={"RAGSCOPE_LLM_BASE_URL": "http://h/v1"}) == [
        "RAGSCOPE_LLM_MODEL"
    ]
    with pytest.raises(DataError, match="http"):
        LLMEndpoint(model="m", base_url="localhost:8000")


def test_explanation_is_asked_once_then_cached(endpoint, store, fx, llm_server):
    route = llm_server.post(CHAT).mock(return_value=completion(REPLY))
    model_key = "tiny|model"
    first = explain_feature(endpoint, model_key, fx.sae_key, fx.feature, fx, store=store)
    assert route.call_count == 1
    assert (first.text, first.cached) == (REPLY, False)
    assert first.feature_key == f"{fx.sae_key}:F{fx.feature}"
    body = json.loads(route.calls.last.request.content)
    assert body["model"] == "fake-explainer"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == build_prompt(fx).user
    assert route.calls.last.request.headers["authorization"] == f"Bearer {KEY}"

    again = explain_feature(endpoint, model_key, fx.sae_key, fx.feature, fx, store=store)
    assert route.call_count == 1
    assert (again.text, again.cached) == (REPLY, True)
    # persisted under the documented key, and read back with no endpoint at all
    with Store(store.path) as other:
        assert (
            other.get_explanation(
                model=model_key, feature_key=first.feature_key, prompt_hash=first.prompt_hash
            )
            == REPLY
        )
        assert explain_feature(None, model_key, fx.sae_key, fx.feature, fx, store=other).cached
    assert route.call_count == 1
    assert first.hallucination == "yes"
    assert first.reason == "invented years"
    assert first.description == "Fires on years the passages lack."


def test_no_endpoint_and_nothing_cached_says_how_to_configure(store, fx):
    with pytest.raises(LLMError, match="RAGSCOPE_LLM_MODEL"):
        explain_feature(None, "m", fx.sae_key, fx.feature, fx, store=store)
    assert cached_explanation("m", fx, store=store) is None


def test_the_key_never_leaks(endpoint, store, fx, llm_server, tmp_path):
    assert KEY not in repr(endpoint) and KEY not in str(endpoint)
    assert "***" in repr(endpoint)
    assert KEY not in repr(
        LLMEndpoint.resolve(env={"RAGSCOPE_LLM_MODEL": "m", "OPENAI_API_KEY": KEY})
    )
    route = llm_server.post(CHAT)
    # a reply that echoes the key is cached without it
    route.mock(return_value=completion(f"Description: uses {KEY} a lot."))
    e = explain_feature(endpoint, "m", fx.sae_key, fx.feature, fx, store=store)
    assert KEY not in e.text
    assert route.calls.last.request.headers["authorization"] == f"Bearer {KEY}"  # it was used
    # an error whose body echoes the key
    route.mock(
        return_value=httpx.Response(401, json={"error": {"message": f"Incorrect API key {KEY}"}})
    )
    with pytest.raises(LLMError) as info:
        explain_feature(endpoint, "m2", fx.sae_key, fx.feature, fx, store=store)
    assert "HTTP 401" in str(info.value) and "RAGSCOPE_LLM_API_KEY" in str(info.value)
    shown = "".join(traceback.format_exception(info.value)) + repr(info.value)
    assert KEY not in shown
    assert info.value.__cause__ is None and info.value.__suppress_context__
    # a long body is cut after the key is blanked, so no part of it is left either
    padded = {"error": {"message": "x" * 270 + KEY + "y" * 50}}
    route.mock(return_value=httpx.Response(403, json=padded))
    with pytest.raises(LLMError, match="HTTP 403") as info:
        explain_feature(endpoint, "m3", fx.sae_key, fx.feature, fx, store=store)
    assert KEY[:10] not in str(info.value)
    store.close()
    files = [p for p in Path(store.path).parent.iterdir() if p.name.startswith("explain.sqlite3")]
    assert files and all(KEY.encode() not in p.read_bytes() for p in files)


def test_server_error_is_a_clear_error(endpoint, store, fx, llm_server):
    route = llm_server.post(CHAT).mock(
        return_value=httpx.Response(500, json={"error": {"message": "boom"}})
    )
    with pytest.raises(LLMError, match=r"HTTP 500.*boom.*try again"):
        explain_feature(endpoint, "m", fx.sae_key, fx.feature, fx, store=store)
    assert route.call_count == 1  # max_retries=0
    assert cached_explanation("m", fx, store=store) is None


@pytest.mark.parametrize("content", ["", "   \n", None])
def test_empty_reply_is_a_clear_error(endpoint, store, fx, llm_server, content):
    llm_server.post(CHAT).mock(return_value=completion(content))
    with pytest.raises(LLMError, match="empty reply"):
        explain_feature(endpoint, "m", fx.sae_key, fx.feature, fx, store=store)
    assert cached_explanation("m", fx, store=store) is None


def test_unreachable_server_is_a_clear_error(store, fx, llm_server):
    llm_server.post(CHAT).mock(side_effect=httpx.ConnectError("refused"))
    ep = LLMEndpoint(model="m", base_url=f"http://user:{KEY}@llm.invalid/v1", max_retries=0)
    assert KEY not in repr(ep)
    with pytest.raises(LLMError, match="could not reach") as info:
        explain_feature(ep, "m", fx.sae_key, fx.feature, fx, store=store)
    assert KEY not in str(info.value)


# --------------------------------------------------------------------------- batches


def _batch(tiny_model, tiny_sae, examples, fx) -> list[FeatureExamples]:
    firing = [fx]
    k = 0
    while len(firing) < 4:
        if k != fx.feature:
            other = feature_examples(tiny_model, tiny_sae, examples, k, n_top=N_TOP)
            if other.n_firing:
                firing.append(other)
        k += 1
    return firing


def test_cancellation_stops_a_batch(
    endpoint, store, fx, llm_server, tiny_model, tiny_sae, examples
):
    items = _batch(tiny_model, tiny_sae, examples, fx)
    route = llm_server.post(CHAT).mock(return_value=completion(REPLY))
    seen: list[tuple[int, int]] = []
    result = explain_many(
        endpoint,
        "m",
        items,
        store=store,
        progress=lambda d, t: seen.append((d, t)),
        should_stop=lambda: len(seen) >= 2,
    )
    assert isinstance(result, BatchResult)
    assert result.cancelled and not result.complete and result.error is None
    assert [e.feature for e in result.done] == [items[0].feature, items[1].feature]
    assert route.call_count == 2 and result.n_requested == 2
    assert seen == [(1, 4), (2, 4)]
    # resumed: the two done come from the cache, the other two are asked
    rest = explain_many(endpoint, "m", items, store=store)
    assert rest.complete and not rest.cancelled
    assert [e.cached for e in rest.done] == [True, True, False, False]
    assert route.call_count == 4


def test_a_failing_batch_stops_at_the_first_error(
    endpoint, store, fx, llm_server, tiny_model, tiny_sae, examples
):
    items = _batch(tiny_model, tiny_sae, examples, fx)
    route = llm_server.post(CHAT).mock(
        side_effect=[completion(REPLY), httpx.Response(503, text="overloaded")]
    )
    result = explain_many(endpoint, "m", items, store=store)
    assert len(result.done) == 1 and not result.cancelled
    assert result.error is not None and "HTTP 503" in result.error
    assert route.call_count == 2


# --------------------------------------------------------------------------- fidelity


def _held_out() -> list[FeatureExample]:
    acts = [
        np.array([0.0, 2.0, 0.0, 4.0, 0.5], np.float32),
        np.array([0.0, 0.0, 0.0], np.float32),
        np.array([1.0, 0.0, 3.0, 0.0], np.float32),
        np.array([0.0, 1.0], np.float32),
    ]
    return [
        FeatureExample(
            example_id=f"h{i}",
            tokens=tuple(f" t{i}{j}" for j in range(a.size)),
            activations=a,
            max_activation=float(a.max()),
        )
        for i, a in enumerate(acts)
    ]


def test_fidelity_is_the_pearson_r_of_predicted_and_real(endpoint, llm_server):
    held = _held_out()
    reply = (
        "Here are my predictions.\n"
        "**Answer 1:** 1=2, 3=5, 4 = 1, 99=5\n"
        "- Answer 2: none\n"
        "Answer 3: 0:1, 2=9\n"  # 9 is clipped to 5
    )  # no line for answer 4: left out
    route = llm_server.post(CHAT).mock(return_value=completion(reply))
    expl = Explanation(feature=1, feature_key="s:F1", prompt_hash="h", text=REPLY, cached=True)
    res = fidelity(endpoint, expl, held)
    predicted = np.array([0, 2, 0, 5, 1, 0, 0, 0, 1, 0, 5, 0], float)
    actual = np.concatenate([h.activations for h in held[:3]]).astype(float)
    assert res.r == pytest.approx(pearsonr(predicted, actual).statistic, abs=1e-12)
    assert res.example_ids == ("h0", "h1", "h2") and res.n_unread == 1 and res.n_tokens == 12
    sent = json.loads(route.calls.last.request.content)["messages"][1]["content"]
    assert "Fires on years the passages lack." in sent and "Hallucination:" not in sent
    assert '0 " t00" | 1 " t01"' in sent and "from 0 (not at all) to 5" in sent


def test_a_budget_fits_the_fidelity_prompt_keeping_firing_and_silent_answers(endpoint, llm_server):
    rng = np.random.default_rng(0)
    held = []
    for i in range(8):
        a = np.zeros(90, np.float32) if i % 2 else rng.random(90).astype(np.float32)
        held.append(
            FeatureExample(
                example_id=f"h{i}",
                tokens=tuple(f" w{i}_{j}" for j in range(90)),
                activations=a,
                max_activation=float(a.max()),
            )
        )
    held.sort(key=lambda e: -e.max_activation)  # firing ones first, as a bad order
    route = llm_server.post(CHAT).mock(return_value=completion("Answer 1: 0=3\nAnswer 2: none"))
    whole = explain.fidelity_prompt("fires on w", held)
    budget = PromptBudget(context=len(whole[1]) // 3, count=_chars, margin=1.0)
    res = fidelity(endpoint, "fires on w", held, budget=budget)
    sent = json.loads(route.calls.last.request.content)["messages"]
    assert budget.fits(sent[0]["content"], sent[1]["content"])
    n = sent[1]["content"].count("Answer ") - 2  # the two in the format example
    assert 2 <= n < 8
    # the answers kept alternate firing and silent; each is cut to the same token cap
    assert [int(i[1:]) % 2 for i in res.example_ids] == [0, 1]  # read: answers 1 and 2
    firing, silent = res.actual
    assert firing.max() > 0 and silent.max() == 0 and firing.size == silent.size < 90
    with pytest.raises(DataError, match="RAGSCOPE_LLM_CONTEXT"):
        fidelity(
            endpoint, "x", held, budget=PromptBudget(context=1024, count=lambda t: 99 * len(t))
        )


def test_fidelity_reply_without_predictions_is_a_clear_error(endpoint, llm_server):
    llm_server.post(CHAT).mock(return_value=completion("I cannot tell."))
    with pytest.raises(LLMError, match="could not read any prediction"):
        fidelity(endpoint, "fires on years", _held_out())


def test_an_explanation_in_another_form_is_kept_whole():
    e = Explanation(feature=1, feature_key="s:F1", prompt_hash="h", text="Years.", cached=False)
    assert (e.description, e.hallucination, e.reason) == ("Years.", None, None)
    e = Explanation(
        feature=1,
        feature_key="s:F1",
        prompt_hash="h",
        text="**Hallucination:** Unclear\n**Description:** Commas.",
        cached=False,
    )
    assert (e.description, e.hallucination, e.reason) == ("Commas.", "unclear", None)


def test_parse_predictions_is_lenient():
    got = parse_predictions("answer 2 - 0=3\nAnswer 2: 1=5\nANSWER 1: none\nAnswer 7: 0=1", [2, 3])
    np.testing.assert_array_equal(got[0], [0, 0])
    np.testing.assert_array_equal(got[1], [3, 0, 0])


def test_the_read_estimate_counts_answers_in_memory_and_paces_the_rest(
    tiny_model, tiny_sae, examples
):
    clear_activation_cache()
    a, b, c = examples[:3]
    encode_answers(tiny_model, tiny_sae, [a])
    timed: list[str] = []

    def pace(ex):
        timed.append(ex.id)
        return time_reading(tiny_model, tiny_sae, ex, "post")

    est = read_estimate(tiny_model, tiny_sae, [a, b, c], activation="post", pace=pace)
    # The first answer not in memory was timed, and its activations kept.
    assert timed == [b.id]
    assert (est.n_examples, est.n_cached, est.n_to_trace) == (3, 2, 1)
    assert est.chars_to_trace == example_chars(c) and est.seconds_per_char > 0
    assert encode_answers(tiny_model, tiny_sae, [a, b]).cache_hits == 2
    # Everything read: nothing is timed; another activation is read apart.
    timed.clear()
    done = read_estimate(tiny_model, tiny_sae, [a, b], activation="post", pace=pace)
    assert timed == [] and done.n_to_trace == 0 and done.seconds == 0.0
    pre = read_estimate(tiny_model, tiny_sae, [a], activation="pre", pace=lambda ex: None)
    assert pre.n_to_trace == 1 and not pre.known
