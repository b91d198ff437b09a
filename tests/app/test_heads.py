"""The Heads & layers page on the tiny model (AppTest).

Copying heads, faithful-vs-hallucinated statistics on a few examples (checked against
:class:`core.analysis.heads_layers.HeadStats` computed directly), the one-answer view (another head
redraws the attention), and the ReDeEP artifacts when some are trained for the model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.components.estimate import TIMING_NOTE
from app.components.head_charts import beta_words
from app.state import estimates
from app.state.heads import (
    HEADS_EXAMPLE_PLAYGROUND,
    HEADS_FROM_CORPUS,
    KEY_HEADS_COMPUTE,
    KEY_HEADS_EXAMPLE,
    KEY_HEADS_EXAMPLE_SOURCE,
    KEY_HEADS_HEAD,
    KEY_HEADS_LAYER,
    KEY_HEADS_LIMIT,
    KEY_HEADS_SOURCE,
    KEY_HEADS_SPLIT,
    KEY_HEADS_TOP,
    KEY_HEADS_UNIT,
)
from app.state.session import STATE_KEY
from core.analysis.heads_layers import HeadStats
from core.base.examples import RAGExample
from core.data import builtin_examples, load_builtin
from core.detectors import make_detector
from core.engine.model import LoadedModel
from core.pipeline.extract import extract_features, run_example
from core.pipeline.judge import judge
from core.pipeline.sets import load_set
from core.signals.copying_heads import copying_scores

HEADS = "views/heads.py"
EXAMPLE = "demo-02-waggle-dance"  # a built-in example with one gold span
ECS_TITLES = (  # title starts of the four heatmaps, answers counted
    "Mean ECS, faithful answers",
    "Mean ECS, hallucinated answers",
    "Mean ECS, faithful − hallucinated",
    "Pearson r of ECS",
)


# --------------------------------------------------------------------------- helpers


def _chunk_table(at: AppTest):
    tables = [t.value for t in at.table if "response chunk" in t.value.columns]
    assert len(tables) == 1, "expected one chunk table"
    return tables[0]


def _heatmaps(at: AppTest) -> list[str]:
    return [h.value for h in at.html if 'class="rs-heatmap"' in h.value]


# --------------------------------------------------------------------------- tests


def test_page_renders_copying_heads_and_one_answer(
    open_page: Callable[[str], AppTest],
    charts: Callable[[AppTest], dict[str, dict]],
    chart: Callable[[AppTest, str], dict],
    z_of: Callable[[dict], np.ndarray],
    page_text: Callable[[AppTest], str],
    tiny_model: LoadedModel,
) -> None:
    at = open_page(HEADS)
    titles = list(charts(at))
    assert any(t.startswith("Copying score per head") for t in titles)
    copying = chart(at, "Copying score per head")
    scores = copying_scores(tiny_model)
    np.testing.assert_allclose(z_of(copying), scores.scores, rtol=1e-6)
    total = scores.scores.size  # 2 x 4 on the tiny model: every head is a "top" one
    assert at.number_input(key=KEY_HEADS_TOP).value == total
    assert len(copying["data"][1]["x"]) == total
    at.number_input(key=KEY_HEADS_TOP).set_value(3).run()
    assert len(chart(at, "Copying score per head")["data"][1]["x"]) == 3
    assert len(at.dataframe[0].value) == 3  # the listed top heads

    # The one-answer view defaults to an example with a gold span and the top head.
    top = scores.top_heads(1)[0]
    assert (at.selectbox(key=KEY_HEADS_LAYER).value, at.selectbox(key=KEY_HEADS_HEAD).value) == top
    assert (
        chart(at, "Attention of")
        .get("layout")["title"]["text"]
        .startswith(f"Attention of L{top[0]}H{top[1]}")
    )
    # No redeep_token artifact here: the fix is named, the tokens show the head's ECS.
    assert "--detectors redeep_token" in page_text(at)
    (heatmap,) = _heatmaps(at)
    assert f"L{top[0]}H{top[1]} ECS" in heatmap and "rs-gold" in heatmap
    chunks = _chunk_table(at)
    assert list(chunks.columns) == [
        "response chunk",
        "attended context chunk",
        "ECS",
        "PKS",
        "gold",
    ]
    assert "hallucinated" in set(chunks["gold"])
    assert "mean PKS over every layer" in page_text(at)


def test_another_head_redraws_the_attention(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    z_of: Callable[[dict], np.ndarray],
) -> None:
    at = open_page(HEADS)
    before = chart(at, "Attention of")
    layer = at.selectbox(key=KEY_HEADS_LAYER).value
    other = 1 - layer  # the tiny model has two layers
    at.selectbox(key=KEY_HEADS_LAYER).set_value(other).run()
    at.selectbox(key=KEY_HEADS_HEAD).set_value(2).run()
    no_exception(at)
    after = chart(at, "Attention of")
    assert after["layout"]["title"]["text"].startswith(f"Attention of L{other}H2")
    assert z_of(after).shape == z_of(before).shape
    assert not np.allclose(z_of(after), z_of(before))
    assert at.session_state[STATE_KEY].heads.head == (other, 2)
    token_table = next(d.value for d in at.dataframe if "top-k context tokens" in d.value.columns)
    assert len(token_table) == z_of(after).shape[0]


def test_dataset_statistics_on_a_few_examples(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    z_of: Callable[[dict], np.ndarray],
    page_text: Callable[[AppTest], str],
    tiny_model: LoadedModel,
) -> None:
    at = open_page(HEADS)
    assert "Press **Compute statistics**" in page_text(at)
    at.number_input(key=KEY_HEADS_LIMIT).set_value(4).run()
    at.button(key=KEY_HEADS_COMPUTE).click().run()
    no_exception(at)
    request = at.session_state[STATE_KEY].heads.request
    assert len(request.ids) == 4 and request.computed + request.cache_hits == 4

    # The heatmaps show exactly what HeadStats computes from the same examples.
    by_id = {e.id: e for e in builtin_examples()}
    examples = [by_id[i] for i in request.ids]
    ext = extract_features(tiny_model, examples, [make_detector("interpdetect")])
    want = HeadStats.from_features(ext.features["interpdetect"], examples)
    assert want.n_faithful and want.n_hallucinated
    for prefix, grid in zip(
        ECS_TITLES,
        (want.ecs_faithful, want.ecs_hallucinated, want.ecs_difference, want.ecs_r),
        strict=True,
    ):
        np.testing.assert_allclose(z_of(chart(at, prefix)), grid, rtol=1e-5, atol=1e-6)
    pks = chart(at, "PKS per layer")
    assert len(pks["data"]) == 3  # faithful, hallucinated, r
    # Four answers are too few: said, the class comparisons greyed, no head ranked.
    assert want.evidence and "anecdotes, not estimates" in want.evidence
    assert any("anecdotes, not estimates" in w.value for w in at.warning)
    notes = [a["text"] for a in chart(at, "Pearson r of ECS")["layout"].get("annotations", [])]
    assert any("too few answers" in t for t in notes)
    assert not chart(at, "Mean ECS, faithful answers")["layout"].get("annotations")
    assert "Strongest heads by r" not in page_text(at)
    assert (
        f"**{want.n_faithful}** faithful and **{want.n_hallucinated}** hallucinated"
        in page_text(at)
    )

    # Sentences instead of answers: the same features, counted per sentence, no new pass.
    at.radio(key=KEY_HEADS_UNIT).set_value("chunk").run()
    no_exception(at)
    per_sentence = HeadStats.from_features(ext.features["interpdetect"], examples, level="chunk")
    assert f"hallucinated sentences from {len(examples)} examples" in page_text(at)
    np.testing.assert_allclose(
        z_of(chart(at, "Pearson r of ECS")), per_sentence.ecs_r, rtol=1e-5, atol=1e-6
    )
    assert at.session_state[STATE_KEY].heads.request == request


def test_corpus_split_statistics(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    z_of: Callable[[dict], np.ndarray],
    page_text: Callable[[AppTest], str],
) -> None:
    at = open_page(HEADS)
    at.selectbox(key=KEY_HEADS_SOURCE).set_value(HEADS_FROM_CORPUS).run()
    assert at.selectbox(key=KEY_HEADS_SPLIT).options == [
        "all splits",
        "train",
        "validation",
        "test",
    ]
    assert at.selectbox(key=KEY_HEADS_SPLIT).value == "train"
    at.selectbox(key=KEY_HEADS_SPLIT).set_value("validation").run()
    at.number_input(key=KEY_HEADS_LIMIT).set_value(4).run()
    at.button(key=KEY_HEADS_COMPUTE).click().run()
    no_exception(at)
    request = at.session_state[STATE_KEY].heads.request
    split = {e.id: e.provenance.split for e in load_builtin()}
    assert len(request.ids) == 4 and {split[i] for i in request.ids} == {"validation"}
    for prefix in ECS_TITLES:
        chart(at, prefix)
    # The example picker lists the chosen split's examples.
    options = at.selectbox(key=KEY_HEADS_EXAMPLE).options
    assert len(options) == sum(1 for s in split.values() if s == "validation")

    # Another split: the computed statistics stay, with a note, until Compute is pressed.
    r_before = z_of(chart(at, "Pearson r of ECS"))
    at.selectbox(key=KEY_HEADS_SPLIT).set_value("test").run()
    no_exception(at)
    assert "Showing the statistics of 4 examples of Built-in labelled corpus" in page_text(at)
    np.testing.assert_array_equal(z_of(chart(at, "Pearson r of ECS")), r_before)
    assert at.session_state[STATE_KEY].heads.request == request


def test_playground_answer_is_the_default(
    open_after_analysis: Callable[[str, str], AppTest],
    chart: Callable[[AppTest, str], dict],
    z_of: Callable[[dict], np.ndarray],
    page_text: Callable[[AppTest], str],
) -> None:
    at = open_after_analysis(EXAMPLE, HEADS)
    assert at.radio(key=KEY_HEADS_EXAMPLE_SOURCE).value == HEADS_EXAMPLE_PLAYGROUND
    assert f"Example `{EXAMPLE}`" in page_text(at)
    analysis = at.session_state[STATE_KEY].analysis
    assert z_of(chart(at, "Attention of")).shape[0] == len(analysis.layout.response_positions)


# --------------------------------------------------------------------------- artifacts


@pytest.fixture(scope="module")
def redeep_artifacts(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """redeep_token and redeep_chunk fitted on the demo examples with the tiny model."""
    out = tmp_path_factory.mktemp("redeep-detectors")
    examples = builtin_examples()
    dets = [make_detector("redeep_token"), make_detector("redeep_chunk")]
    feats = [run_example(tiny_model, ex, dets) for ex in examples]
    for d in dets:
        d.fit([f[d.name] for f in feats], examples).save(out / d.name)
    return out


def test_redeep_artifacts_colour_tokens_and_score_chunks(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    page_text: Callable[[AppTest], str],
    monkeypatch: pytest.MonkeyPatch,
    redeep_artifacts: Path,
    tiny_model: LoadedModel,
) -> None:
    from core.detectors import load_shipped

    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(redeep_artifacts))
    at = open_page(HEADS)
    at.selectbox(key=KEY_HEADS_EXAMPLE).set_value(EXAMPLE).run()
    no_exception(at)
    assert "No trained redeep_token" not in page_text(at)
    (heatmap,) = _heatmaps(at)
    assert "redeep_token score" in heatmap

    # The page's numbers are the detectors' own verdicts on this answer.
    example = next(e for e in builtin_examples() if e.id == EXAMPLE)
    key = tiny_model.info.key
    tok = load_shipped("redeep_token", key, redeep_artifacts)
    chk = load_shipped("redeep_chunk", key, redeep_artifacts)
    feats = run_example(tiny_model, example, [tok, chk])
    verdict = tok.predict(feats["redeep_token"])
    # The answer's probability, threshold and flag are the set's verdict, as on the
    # Playground; the chunk table's scores are raw and labelled so.
    judged = judge(tiny_model, example, load_set(key)).verdicts
    for name in ("redeep_token", "redeep_chunk"):
        v = judged[name]
        flag = "flagged" if v.hallucinated else "not flagged"
        assert (
            f"{name} detector gives this answer a probability **{v.score:.3f}** "
            f"(threshold {v.threshold:.3f}: {flag}), as the Playground shows" in page_text(at)
        )
    # beta is said in words (beta = 0 would otherwise read as a bug)
    assert beta_words(float(verdict.explanation["beta"])) in page_text(at)
    shown = [float(v) for v in re_values(heatmap, "redeep_token score")]
    np.testing.assert_allclose(shown, np.round(verdict.token_scores, 2), atol=0.006)
    table = _chunk_table(at)
    np.testing.assert_allclose(
        table["redeep_chunk raw score"],
        chk.predict(feats["redeep_chunk"]).chunk_scores,
        rtol=1e-5,
    )
    layers = ", ".join(f"L{x}" for x in chk.selected_layers)
    assert f"redeep_chunk detector's selected layers ({layers})" in page_text(at)


def re_values(heatmap: str, name: str) -> list[str]:
    """The value each token's hover title shows, in token order."""
    import re

    body = heatmap.split("</style>", 1)[1]
    return re.findall(re.escape(name) + r": ([-0-9.]+)", body)


def test_the_estimate_times_an_answer_once_not_each_time_the_page_opens(
    open_page: Callable[[str], AppTest],
    monkeypatch: pytest.MonkeyPatch,
    page_text: Callable[[AppTest], str],
    settled: Callable[[AppTest], AppTest],
) -> None:
    timed: list[str] = []
    real = estimates.time_extraction

    def spy(model: LoadedModel, example: RAGExample, detectors: object, cache: object) -> float:
        timed.append(example.id)
        return real(model, example, detectors, cache)

    monkeypatch.setattr(estimates, "time_extraction", spy)
    estimates.forget_timings()  # a fresh server process: only the database remembers
    at = open_page(HEADS)
    assert TIMING_NOTE in page_text(at)  # timing in the background: the page is ready
    at = settled(at)
    assert len(timed) == 1  # the first open times one answer (its features are kept)
    assert "Estimated time on this machine" in page_text(at)
    estimates.forget_timings()
    again = open_page(HEADS)  # another session, as after a restart: the pace is recorded
    assert len(timed) == 1, timed
    assert "Estimated time on this machine" in page_text(again)
