"""Detector framework, batch extraction with its cache, and the three baselines (tiny model)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError, ModelError, NotFittedError
from core.base.examples import RAGExample, Span
from core.detectors import DETECTORS, available_detectors, detector_class, make_detector
from core.engine.layout import render
from core.engine.trace import token_surprisal, trace
from core.learning.contract import Features, Verdict
from core.pipeline import extract as extract_mod
from core.pipeline.extract import FeatureCache, extract_features, run_example
from core.storage import Store


def _examples() -> list[RAGExample]:
    """Four faithful and four hallucinated answers, each with distinct content."""
    good = "The Old Bridge was built by Ada Lovell in 1820."
    bad = "The Old Bridge was built by Ada Lovell in 1820 from red granite."
    a = bad.index("red granite")
    out = []
    for i in range(4):
        kw = dict(
            question="Who built the Old Bridge, and when?",
            passages=(
                "The Old Bridge was built by Ada Lovell in 1820.",
                f"It is bridge number {i + 1}.",
            ),
        )
        out.append(RAGExample(id=f"g{i}", response=good, label=False, **kw))
        out.append(RAGExample(id=f"b{i}", response=bad, spans=(Span(start=a, end=a + 11),), **kw))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    with Store(tmp_path_factory.mktemp("db") / "t.sqlite3") as s:
        yield s


def test_registry_lists_baselines_and_refuses_duplicates() -> None:
    assert {"nll", "context_gain", "lexical"} <= set(available_detectors())
    cls = detector_class("nll")

    class Impostor(cls):  # same name, different class
        pass

    with pytest.raises(ValueError, match="already registered"):
        DETECTORS.extended(Impostor)
    assert DETECTORS.get("nll") is cls  # the registry itself is untouched
    with pytest.raises(DataError, match="unknown detector 'nope'.*nll"):
        make_detector("nope")
    with pytest.raises(DataError, match="unknown LexicalConfig options"):
        make_detector("lexical", colour="red")


def test_features_validate_shapes_and_round_trip_bytes() -> None:
    with pytest.raises(ValueError, match="2 response values for 1 names"):
        Features(detector="x", example_id="e", model="m", names=("a",), response=np.zeros(2))
    with pytest.raises(ValueError, match="character offsets"):
        Features(
            detector="x",
            example_id="e",
            model="m",
            names=("a",),
            response=np.zeros(1),
            token_names=("t",),
            tokens=np.zeros((3, 1)),
        )
    f = Features(
        detector="x",
        example_id="e",
        model="m",
        names=("a", "b"),
        response=np.array([1.0, 2.0]),
        token_names=("t",),
        tokens=np.arange(3.0)[:, None],
        token_offsets=np.array([[0, 1], [1, 2], [2, 4]]),
    )
    g = Features.from_bytes(f.to_bytes(), example_id="other")
    assert g.example_id == "other" and g.model == "m" and g.names == ("a", "b")
    np.testing.assert_array_equal(g.response, f.response)
    np.testing.assert_array_equal(g.tokens, f.tokens)
    np.testing.assert_array_equal(g.token_offsets, f.token_offsets)
    assert g.chunks is None


def test_verdict_score_must_be_a_probability() -> None:
    with pytest.raises(ValueError, match="outside"):
        Verdict(detector="x", example_id="e", score=1.5)
    with pytest.raises(ValueError, match="outside"):
        Verdict(detector="x", example_id="e", score=float("nan"))


def test_one_trace_per_example_for_all_detectors(tiny_model, monkeypatch) -> None:
    calls = []
    real = extract_mod.trace_batch

    def counting(model, layouts, needs, **kw):
        calls.extend(layout.with_context for layout in layouts)
        return real(model, layouts, needs, **kw)

    monkeypatch.setattr(extract_mod, "trace_batch", counting)
    ex = _examples()[1]
    dets = [make_detector(n) for n in ("nll", "context_gain", "lexical")]
    feats = run_example(tiny_model, ex, dets)
    assert set(feats) == {"nll", "context_gain", "lexical"}
    assert calls == [True, False]  # one pass with context, one without (context_gain asked)
    calls.clear()
    run_example(tiny_model, ex, [make_detector("lexical")])
    assert calls == []  # lexical reads no activations
    calls.clear()
    run_example(tiny_model, ex, [make_detector("nll")])
    assert calls == [True]


def test_baseline_features_match_their_definitions(tiny_model) -> None:
    ex = _examples()[1]
    dets = [make_detector(n) for n in ("nll", "context_gain", "lexical")]
    f = run_example(tiny_model, ex, dets)
    layout = render(ex, tiny_model)
    s_full = token_surprisal(trace(tiny_model, layout, dets[0].needs(tiny_model.info)))
    s_bare = token_surprisal(
        trace(
            tiny_model, render(ex, tiny_model, with_context=False), dets[0].needs(tiny_model.info)
        )
    )
    np.testing.assert_allclose(f["nll"].tokens[:, 0], s_full, atol=1e-5)
    np.testing.assert_allclose(
        f["nll"].response, [s_full.mean(), s_full.max(), np.percentile(s_full, 90)], rtol=1e-5
    )
    np.testing.assert_allclose(f["context_gain"].tokens[:, 0], s_bare - s_full, atol=1e-5)
    lex = f["lexical"]
    # "granite" is the only content word (NOUN/PROPN/NUM) the passages never mention
    flagged = {
        layout.response_text[a:b].strip()
        for (a, b), v in zip(lex.token_offsets, lex.tokens[:, 0], strict=True)
        if v
    }
    assert "".join(sorted(flagged)) and all(w in "granite" for w in flagged)
    share, n_absent, n_content = lex.response
    assert n_absent == 1 and n_content >= 5 and share == pytest.approx(n_absent / n_content)
    # token labels come from the example's spans via the offsets
    lab = lex.token_labels(ex)
    assert lab is not None and lab.sum() >= 2 and np.all(lab[lex.tokens[:, 0] > 0] == 1)


def test_cache_makes_reruns_free_and_extraction_resumable(tiny_model, store) -> None:
    exs = _examples()
    dets = [make_detector(n) for n in ("nll", "lexical")]
    cache = FeatureCache(store)

    class Stop(Exception):
        pass

    def stop_after_3(done: int, total: int) -> None:
        if done == 3:
            raise Stop

    with pytest.raises(Stop):
        extract_features(tiny_model, exs, dets, cache=cache, progress=stop_after_3)
    resumed = extract_features(tiny_model, exs, dets, cache=cache)
    assert resumed.cache_hits == 3 and resumed.computed == len(exs) - 3
    again = extract_features(tiny_model, exs, dets, cache=cache)
    assert again.cache_hits == len(exs) and again.computed == 0
    for name in ("nll", "lexical"):
        for a, b in zip(resumed.features[name], again.features[name], strict=True):
            np.testing.assert_array_equal(a.response, b.response)
    # Another config is another cache key.
    other = extract_features(
        tiny_model, exs[:2], [make_detector("lexical", pos=("NUM",))], cache=cache
    )
    assert other.computed == 2


def test_bad_example_is_skipped_with_its_error(tiny_model) -> None:
    exs = _examples()[:2]
    long = dataclasses.replace(exs[0], id="too-long", passages=("word " * 3000,))
    res = extract_features(tiny_model, [long, *exs], [make_detector("nll")], on_error="skip")
    assert [e.id for e in res.examples] == [e.id for e in exs]
    assert len(res.errors) == 1 and "too-long" in str(res.errors[0])
    with pytest.raises(DataError, match="too-long"):
        extract_features(tiny_model, [long], [make_detector("nll")])


@pytest.mark.parametrize("name", ["nll", "context_gain", "lexical"])
def test_fit_predict_save_load(tiny_model, tmp_path: Path, name: str, reseal) -> None:
    exs = _examples()
    res = extract_features(tiny_model, exs, [make_detector(name)])
    det = make_detector(name)
    with pytest.raises(NotFittedError, match=f"ragscope train --detectors {name}"):
        det.predict(res.features[name][0])
    det.fit(res.features[name], res.examples)
    v = det.predict(res.features[name][1])
    assert 0 <= v.score <= 1 and set(v.explanation) == set(res.features[name][1].names)
    assert v.token_scores is not None and v.token_scores.shape == (
        len(res.features[name][1].token_offsets),
    )
    assert det.token_model_ is not None  # spans in training -> token-level fit
    det.threshold_ = 0.37
    folder = det.save(tmp_path / name)
    again = type(det).load(folder, model_key=tiny_model.info.key)
    assert again.threshold_ == 0.37
    w = again.predict(res.features[name][1])
    assert w.score == pytest.approx(v.score)
    np.testing.assert_allclose(w.token_scores, v.token_scores, rtol=1e-6)
    with pytest.raises(ModelError, match="trained on model"):
        type(det).load(folder, model_key="another-model")
    with pytest.raises(DataError, match="not 'nll'|is for detector"):
        detector_class("nll" if name != "nll" else "lexical").load(folder)
    # Valid JSON with the wrong content is a DataError naming the folder and the fix.
    (folder / "weights.json").write_text('{"response": {"kind": "logistic"}}')
    with pytest.raises(DataError, match="weights.json does not match the SHA-256"):
        type(det).load(folder)
    reseal(folder)
    with pytest.raises(DataError, match=f"malformed {name} artifact.*ragscope train") as err:
        type(det).load(folder)
    assert str(folder) in str(err.value)


def test_lexical_detector_separates_the_toy_set(tiny_model) -> None:
    exs = _examples()
    res = extract_features(tiny_model, exs, [make_detector("lexical")])
    det = make_detector("lexical").fit(res.features["lexical"], res.examples)
    scores = [det.predict(f).score for f in res.features["lexical"]]
    labels = [bool(e.label) for e in res.examples]
    assert min(s for s, y in zip(scores, labels, strict=True) if y) > max(
        s for s, y in zip(scores, labels, strict=True) if not y
    )


def test_fit_refuses_unlabelled_and_single_class(tiny_model) -> None:
    exs = _examples()
    res = extract_features(tiny_model, exs[:2], [make_detector("lexical")])
    unl = [e.with_response(e.response) for e in res.examples]
    with pytest.raises(DataError, match="no label"):
        make_detector("lexical").fit(res.features["lexical"], unl)
    only_good = [e for e in res.examples if e.label is False]
    feats = [
        f for f, e in zip(res.features["lexical"], res.examples, strict=True) if e.label is False
    ]
    with pytest.raises(DataError, match="both faithful"):
        make_detector("lexical").fit(feats, only_good)


def test_streamed_features_equal_the_shared_pass_and_come_as_soon_as_ready(
    tiny_model, monkeypatch
) -> None:
    from core.detectors import runnable_detectors
    from core.pipeline.extract import stream_example

    ex = _examples()[1]
    ens = make_detector("ensemble", members=("nll", "lexical", "cortex"))
    dets = [make_detector(n) for n in runnable_detectors(tiny_model)] + [ens]
    want = run_example(tiny_model, ex, dets)
    passes: list[bool] = []
    real = extract_mod.trace_batch

    def counting(model, layouts, needs, **kw):
        passes.extend(layout.with_context for layout in layouts)
        return real(model, layouts, needs, **kw)

    monkeypatch.setattr(extract_mod, "trace_batch", counting)
    seen: list = []
    steps = list(stream_example(tiny_model, ex, dets, on_trace=seen.append))
    assert passes == [True, False]  # the same one pass with context and one without
    order = [s.detector or s.stage for s in steps]
    assert order[0] == "lexical"  # reads no activations: before any forward pass
    assert order.index("trace") < order.index("nll") < order.index("bare")
    assert order.index("bare") < order.index("cortex") < order.index("ensemble")
    assert order.index("bare") < order.index("context_gain")
    assert sorted(s.detector for s in steps if s.stage == "features") == sorted(want)
    assert len(seen) == 1 and seen[0].layout.with_context
    for s in steps:
        if s.stage != "features":
            continue
        f, g = want[s.detector], s.features
        if f.members is not None:  # the ensemble: its members' features, bundled
            f, g = f.members["cortex"], g.members["cortex"]
        np.testing.assert_array_equal(g.response, f.response)
        for a, b in ((g.tokens, f.tokens), (g.chunks, f.chunks)):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)
    # Only what was asked for: members are computed, not reported.
    only = list(stream_example(tiny_model, ex, [ens]))
    assert [s.detector for s in only if s.stage == "features"] == ["ensemble"]
