"""Counterfactual context edits: the edited example, the word diff, the case-study presets,
scores of both versions, and sessions saved to SQLite and exported as JSON."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.examples import RAGExample, Span
from core.data import builtin_examples
from core.detectors import make_detector
from core.detectors.redeep import RedeepTokenDetector
from core.detectors.spad import SpadDetector
from core.interventions.counterfactual import (
    NO_CONTEXT,
    STAND_IN_NAME,
    Counterfactual,
    alter_claim,
    claim_sentence,
    context_diff,
    contradict_span,
    edit_example,
    load_session,
    regenerate,
    score_original,
    score_pair,
    support_span,
)
from core.pipeline.extract import extract_features
from core.storage import Store

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def demo() -> list[RAGExample]:
    return builtin_examples()


@pytest.fixture(scope="module")
def spanned(demo) -> RAGExample:
    return next(e for e in demo if e.id == "demo-04-mount-kelsey")


def test_fixed_answer_keeps_the_answer_and_its_gold(spanned: RAGExample) -> None:
    edited = edit_example(spanned, [spanned.passages[0].replace("a", "e", 1), "  "])
    assert edited.response == spanned.response and edited.spans == spanned.spans
    assert edited.label == spanned.label and len(edited.passages) == 1
    for s in edited.spans:  # offsets still point at the same answer characters
        assert edited.response[s.start : s.end] == spanned.response[s.start : s.end]
    assert edit_example(spanned, ["", " "]).passages == (NO_CONTEXT,)
    regen = edit_example(spanned, spanned.passages, answer="A new answer.")
    assert regen.spans == () and regen.label is None and regen.response == "A new answer."
    with_prompt = dataclasses.replace(spanned, prompt=None)
    assert edit_example(with_prompt, spanned.passages).prompt is None


def test_context_diff_names_each_change() -> None:
    orig = ("The bridge opened in 1820. It is 40 m long.", "Second passage.")
    changes = context_diff(orig, ("The bridge opened in 1827. It is long.",))
    assert [(c.passage, c.op, c.old, c.new) for c in changes] == [
        (0, "replace", "1820.", "1827."),
        (0, "delete", "40 m", ""),
        (1, "remove_passage", "Second passage.", ""),
    ]
    assert context_diff(orig, (*orig, "New one."))[0].op == "add_passage"
    assert context_diff(orig, orig) == []
    assert "“1820.” → “1827.”" in changes[0].describe()


def test_presets_state_the_claim_and_state_it_differently(spanned: RAGExample) -> None:
    s = spanned.spans[0]
    a, b = claim_sentence(spanned.response, s)
    claim = spanned.response[a:b]
    assert a <= s.start < b and claim.strip()
    sup = support_span(spanned)
    assert any(p.endswith(claim.strip()) for p in sup)
    assert sum(p != q for p, q in zip(sup, spanned.passages, strict=True)) == 1
    con = contradict_span(spanned)
    changed = [p for p, q in zip(con, spanned.passages, strict=True) if p != q]
    assert len(changed) == 1 and claim.strip() not in changed[0]
    with pytest.raises(DataError, match="no hallucination span"):
        support_span(dataclasses.replace(spanned, spans=(), label=False))


def test_alter_claim_shifts_numbers_then_names_then_negates() -> None:
    assert alter_claim("It opened in 1820 and cost 3.5 million.", "1820") == (
        "It opened in 1827 and cost 3.5 million."
    )
    assert alter_claim("It was built by Ada Lovell.", "Ada Lovell") == (
        f"It was built by {STAND_IN_NAME}."
    )
    assert alter_claim("It is very old.", "very old") == "It is not very old."


@pytest.fixture(scope="module")
def detectors(tiny_model, demo):
    dets = [make_detector("nll"), make_detector("context_gain")]
    feats = extract_features(tiny_model, demo, dets).features
    return [d.fit(list(feats[d.name]), demo) for d in dets]


def test_score_pair_save_load_and_export(tiny_model, detectors, spanned, tmp_path) -> None:
    edited = edit_example(spanned, support_span(spanned))
    cf = score_pair(tiny_model, detectors, spanned, edited, name="support the claim")
    assert set(cf.original_scores) == set(cf.edited_scores) == {"nll", "context_gain"}
    # The answer is fixed: nll reads only the answer given its prompt, and the prompt changed.
    o, e = cf.original_scores["context_gain"], cf.edited_scores["context_gain"]
    assert o.token_offsets == e.token_offsets and len(o.token_scores) == len(e.token_scores)
    assert o.token_scores != e.token_scores
    assert cf.changes and cf.changes[0].op == "insert"
    with Store(tmp_path / "db.sqlite3") as store:
        cf_id = store.save_counterfactual(cf)
        assert store.list_counterfactuals(cf.model)[0][:3] == (cf_id, cf.name, spanned.id)
        back = load_session(store, cf_id)
        assert back.to_dict() == cf.to_dict() and back.id == cf_id
        store.delete_counterfactual(cf_id)
        with pytest.raises(DataError, match="no saved counterfactual"):
            load_session(store, cf_id)
    exported = json.loads(cf.to_json())
    assert exported["changes"][0]["op"] == "insert"
    assert Counterfactual.from_dict(exported).edited == cf.edited
    with pytest.raises(DataError, match="format"):
        Counterfactual.from_dict({**exported, "format": 99})


def test_an_original_scored_ahead_is_the_pairs_original_side(
    tiny_model, detectors, spanned, demo
) -> None:
    """The side scored to time the first estimate is Compare's own original side: reused
    when it is the same original on the same model, scored again otherwise."""
    ahead = score_original(tiny_model, detectors, spanned)
    assert ahead.seconds > 0
    edited = edit_example(spanned, support_span(spanned))
    cf = score_pair(tiny_model, detectors, spanned, edited, name="s", scored=ahead)
    assert cf.original_scores is ahead.scores
    fresh = score_pair(tiny_model, detectors, spanned, edited, name="s")
    assert fresh.original_scores == ahead.scores  # what scoring it again would give
    other = next(e for e in demo if e.id != spanned.id)
    elsewhere = score_pair(tiny_model, detectors, other, edited, name="s", scored=ahead)
    assert elsewhere.original_scores is not ahead.scores
    assert elsewhere.original_scores != ahead.scores


def test_regenerate_writes_a_new_answer_under_the_edit(tiny_model, spanned) -> None:
    edited = regenerate(
        tiny_model, spanned, ["Only this passage."], max_new_tokens=6, temperature=1.0, seed=0
    )
    assert edited.passages == ("Only this passage.",)
    assert edited.response.strip() and edited.response != spanned.response
    assert edited.label is None and edited.spans == ()
    # The random tiny model's greedy answer here is only newlines: refused, not kept.
    with pytest.raises(DataError, match="empty answer"):
        regenerate(tiny_model, spanned, ["Only this passage."], max_new_tokens=6)


def test_span_objects_are_accepted(spanned) -> None:
    s = Span(start=spanned.spans[0].start, end=spanned.spans[0].end)
    assert support_span(spanned, s) == support_span(spanned, 0)


def test_detector_views_spad_sources_and_redeep_selected_heads() -> None:
    from types import SimpleNamespace

    from core.interventions.counterfactual import SideScore, detector_views
    from core.learning.contract import Features

    tokens = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = Features(
        detector="x",
        example_id="e",
        model="m",
        names=("a",),
        response=np.zeros(1),
        token_names=("Query", "RAG", "Past", "P_final"),
        tokens=tokens,
        token_offsets=np.asarray([[0, 1], [1, 2], [2, 3]]),
    )
    rows, summary = detector_views(
        SimpleNamespace(name="spad", explained_on=SpadDetector.explained_on), f
    )
    assert rows == {} and summary == {"Query": 4.0, "RAG": 5.0, "Past": 6.0, "P_final": 7.0}
    det = SimpleNamespace(
        name="redeep_token",
        explained_on=RedeepTokenDetector.explained_on,
        selection_=SimpleNamespace(heads=(0, 2)),
    )
    rows, summary = detector_views(det, f)
    assert rows == {"ECS of the selected heads": (1.0, 5.0, 9.0)} and summary == {}
    side = SideScore(score=0.5, flagged=True, token_rows=rows, summary={"RAG": 1.5})
    assert SideScore.from_dict(json.loads(json.dumps(side.to_dict()))) == side
