"""One span decision per answer, by the set (core.pipeline.span_judge), with a rule chosen
for span F1 in cross-validation (core.evaluation.span_choice) and read back from a
``cfg.json`` as outside input (core.learning.span_rule)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.examples import Provenance, RAGExample, Span
from core.evaluation.span_choice import (
    MAX_FAITHFUL_SHARE,
    choose_span_rule,
    recorded_rule,
)
from core.learning.contract import Verdict
from core.learning.span_rule import SpanRule, default_rule
from core.pipeline.judge import VOTE, answer_verdict
from core.pipeline.span_judge import answer_sentences, decide_spans, rule_spans, span_judge

ANSWER = "The bridge was built in 1912 by Ada Lovell. It is made of stone."
PASSAGES = ("The Old Bridge was built in 1887 by Ada Lovell. It is made of stone and iron.",)


def _tokens(text: str) -> np.ndarray:
    return np.array([(m.start(), m.end()) for m in re.finditer(r"\s?\w+|\s?[^\w\s]", text)])


def _scores(text: str, words: set[str], high: float = 0.9, low: float = 0.05) -> np.ndarray:
    offs = _tokens(text)
    return np.asarray([high if text[a:b].strip() in words else low for a, b in offs])


def _verdict(
    name: str, scores: np.ndarray | None, *, p: float = 0.8, thr: float = 0.5, text: str = ANSWER
) -> Verdict:
    return Verdict(
        detector=name,
        example_id="x",
        score=p,
        hallucinated=p >= thr,
        threshold=thr,
        token_scores=scores,
        token_offsets=_tokens(text) if scores is not None else None,
    )


@dataclass
class _Det:
    """A fitted detector as far as the span judge reads one."""

    name: str
    gives_token_scores: bool = True
    token_threshold_: float | None = 0.5
    threshold_: float = 0.5
    span_rule_: SpanRule | None = None
    extra: dict = field(default_factory=dict)

    @property
    def composite(self) -> bool:
        """The ensemble combines the others (the class trait the span judge reads)."""
        return self.name == "ensemble"


def _example(spans: tuple[Span, ...] = (), label: bool | None = None, **kw) -> RAGExample:
    return RAGExample(
        id=kw.get("id", "x"),
        task="qa",
        question="When was the bridge built?",
        passages=kw.get("passages", PASSAGES),
        response=kw.get("response", ANSWER),
        label=label,
        spans=spans,
        provenance=Provenance(dataset="t", group=kw.get("group")),
    )


# -- the rule, as outside input ---------------------------------------------------


def test_a_rule_round_trips_and_hostile_rules_are_refused_naming_the_field() -> None:
    rule = SpanRule(threshold=0.4, answer_weight=1.0, gate=True, gap_tokens=3)
    assert SpanRule.from_json(rule.to_json()) == rule
    good = rule.to_json()
    for bad, word in [
        ({**good, "threshold": float("nan")}, "threshold"),
        ({**good, "threshold": 1.5}, "threshold"),
        ({**good, "threshold": True}, "threshold"),
        ({**good, "answer_weight": 1e9}, "answer_weight"),
        ({**good, "gap_tokens": 10**6}, "gap_tokens"),
        ({**good, "gap_tokens": 2.0}, "gap_tokens"),
        ({**good, "gate": "yes"}, "gate"),
        ({**good, "chosen": "magic"}, "chosen"),
        ({**good, "extend": "paragraph"}, "extend"),
        ({**good, "measured": {"x" * 100: 1}}, "measured"),
        ({**good, "measured": {f"k{i}": 1 for i in range(100)}}, "measured"),
        ({**good, "measured": {"f1": [1, 2]}}, "measured"),
        ({**good, "extra": 1}, "keys"),
        ([1, 2], "keys"),
    ]:
        with pytest.raises(DataError, match=word):
            SpanRule.from_json(bad)


def test_the_combined_score_moves_tokens_by_how_suspect_the_answer_is() -> None:
    tok = np.asarray([0.1, 0.5, 0.9])
    plain = SpanRule(threshold=0.5)
    assert np.allclose(plain.combined(tok, 0.99, 0.5), tok)
    weighted = SpanRule(threshold=0.5, answer_weight=1.0)
    assert np.allclose(weighted.combined(tok, 0.3, 0.3), tok)  # at its threshold: unchanged
    assert (weighted.combined(tok, 0.9, 0.3) > tok).all()
    assert (weighted.combined(tok, 0.01, 0.3) < tok).all()


def test_a_rule_says_whether_a_cross_validation_chose_it_and_which() -> None:
    """The span note says which rule a set's spans follow: one chosen for spans in a
    cross-validation names its run and data; a judge without one uses its token
    threshold, and says it was not chosen for spans (no "not cross-validated" beside a
    README that says the rule is chosen in cross-validation)."""
    plain = default_rule(0.3).describe()
    assert plain.endswith(
        "; the judge's token threshold, not a rule chosen for spans in cross-validation"
    )
    chosen = SpanRule(
        threshold=0.35,
        gap_tokens=1,
        chosen="cross-validation",
        measured={"f1": 0.4, "run": "ragtruth-fast-spans", "datasets": "ragtruth_qa_dev"},
    ).describe()
    assert "runs within 1 token merge" in chosen
    assert chosen.endswith(
        "; a rule chosen for span F1 in cross-validation (run ragtruth-fast-spans on "
        "ragtruth_qa_dev)"
    )
    # a rule recorded without its run still says a cross-validation chose it
    bare = SpanRule(threshold=0.35, chosen="cross-validation").describe()
    assert bare.endswith("; a rule chosen for span F1 in cross-validation")


# -- the decision ----------------------------------------------------------------------


def test_sentence_extension_widens_a_phrase_to_the_claim_it_stands_in() -> None:
    text = "4. Click on the General tab.\n5. Save it. The bridge is 1.5 m wide. Done."
    assert [text[a:b] for a, b in answer_sentences(text)] == [
        "4. Click on the General tab.",
        "5. Save it.",
        "The bridge is 1.5 m wide.",
        "Done.",
    ]
    v = _verdict("e", _scores(text, {"General", "1"}), text=text)
    words = rule_spans(text, v, SpanRule(threshold=0.5, gap_tokens=0))[0]
    sentences = rule_spans(text, v, SpanRule(threshold=0.5, gap_tokens=0, extend="sentence"))[0]
    assert [text[a:b] for a, b, _ in words] == ["General", "1"]
    assert [text[a:b] for a, b, _ in sentences] == [
        "4. Click on the General tab.",
        "The bridge is 1.5 m wide.",
    ]
    assert "sentences they stand in" in SpanRule(threshold=0.5, extend="sentence").describe()


def test_spans_are_whole_words_merged_into_phrases_and_gated_by_the_answer_verdict() -> None:
    scores = _scores(ANSWER, {"1912", "in"})
    spans, top = rule_spans(ANSWER, _verdict("ensemble", scores), SpanRule(threshold=0.5))
    assert [ANSWER[a:b] for a, b, _ in spans] == ["in 1912"] and top == pytest.approx(0.9)
    faithful = _verdict("ensemble", scores, p=0.2, thr=0.5)
    assert rule_spans(ANSWER, faithful, SpanRule(threshold=0.5))[0] == []
    ungated = SpanRule(threshold=0.5, gate=False)
    assert [ANSWER[a:b] for a, b, _ in rule_spans(ANSWER, faithful, ungated)[0]] == ["in 1912"]
    # " built" and " 1912" two tokens apart: one phrase within a gap of 2, two spans without
    two = _scores(ANSWER, {"built", "1912"})
    merged = rule_spans(ANSWER, _verdict("e", two), SpanRule(threshold=0.5, gap_tokens=2))[0]
    split = rule_spans(ANSWER, _verdict("e", two), SpanRule(threshold=0.5, gap_tokens=0))[0]
    assert [ANSWER[a:b] for a, b, _ in merged] == ["built in 1912"]
    assert [ANSWER[a:b] for a, b, _ in split] == ["built", "1912"]


def test_the_set_decides_once_the_members_only_agree_and_each_span_carries_evidence() -> None:
    ex = _example()
    verdicts = {
        "ensemble": _verdict("ensemble", _scores(ANSWER, {"1912"})),
        "nll": _verdict("nll", _scores(ANSWER, {"1912", "stone"})),  # flags more than the set
        "cortex": _verdict("cortex", _scores(ANSWER, {"Ada"})),
        "raglens": _verdict("raglens", None),
    }
    dets = [
        _Det("nll"),
        _Det("cortex"),
        _Det("raglens", gives_token_scores=False, token_threshold_=None),
        _Det("ensemble"),
    ]
    d = decide_spans(ex, dets, verdicts)  # type: ignore[arg-type]
    assert d.judge == "ensemble" and [s.text for s in d.spans] == ["1912"]
    (s,) = d.spans
    assert dict(s.detectors) == {"nll": (0.9, 0.5)}  # cortex flags elsewhere: no agreement
    assert s.type == "contradicted" and s.evidence is not None
    assert "1887" in s.reason and "1912" in s.reason
    assert "1887" in s.evidence.text and s.evidence.passage == 0
    assert not d.note
    # a union of the members would have flagged "stone" and "Ada" too: the set does not
    assert "stone" not in {x.text for x in d.spans}


def test_no_span_says_why() -> None:
    ex = _example()
    faithful = {"ensemble": _verdict("ensemble", _scores(ANSWER, {"1912"}), p=0.1)}
    d = decide_spans(ex, [_Det("ensemble")], faithful)  # type: ignore[arg-type]
    assert d.spans == () and "faithful" in d.note
    low = {"ensemble": _verdict("ensemble", _scores(ANSWER, {"1912"}, high=0.3))}
    d = decide_spans(ex, [_Det("ensemble")], low)  # type: ignore[arg-type]
    assert (
        d.spans == () and "0.500" in d.note and "0.300" in d.note and "cannot say where" in d.note
    )
    ungated = _Det("ensemble", span_rule_=SpanRule(threshold=0.5, gate=False))
    low_faithful = {"ensemble": _verdict("ensemble", _scores(ANSWER, {"1912"}, high=0.3), p=0.1)}
    d = decide_spans(ex, [ungated], low_faithful)  # type: ignore[arg-type]
    assert d.spans == () and "0.500" in d.note and "hallucinated" not in d.note
    none = decide_spans(
        ex,
        [_Det("raglens", gives_token_scores=False, token_threshold_=None)],
        {"raglens": _verdict("raglens", None)},
    )  # type: ignore[arg-type]
    assert none.judge is None and "scores tokens" in none.note


def test_a_set_without_an_ensemble_prefers_a_detector_with_a_cross_validated_rule() -> None:
    cv = SpanRule(threshold=0.3, chosen="cross-validation")
    dets = [
        _Det("nll"),
        _Det("cortex", span_rule_=cv),
        _Det("raglens", gives_token_scores=False, token_threshold_=None),
    ]
    assert span_judge(dets).name == "cortex"  # type: ignore[arg-type, union-attr]
    assert span_judge(dets[:1]).name == "nll"  # type: ignore[arg-type, union-attr]


def test_a_set_without_an_ensemble_flags_spans_only_where_its_vote_flags_the_answer() -> None:
    """The span judge (one member) flags the answer, but the set's vote (1 of 3) calls it
    faithful: the set shows no span, and says why; when the vote flags it, the judge's
    spans show."""
    ex = _example()
    dets = [
        _Det("nll", token_threshold_=None, gives_token_scores=False),
        _Det("cortex"),
        _Det("raglens", gives_token_scores=False, token_threshold_=None),
    ]
    verdicts = {
        "nll": _verdict("nll", None, p=0.2),
        "cortex": _verdict("cortex", _scores(ANSWER, {"1912"})),  # flags it
        "raglens": _verdict("raglens", None, p=0.3),
    }
    v = answer_verdict(ex, dets, verdicts, set_name="custom")  # type: ignore[arg-type]
    assert v.judge == VOTE and not v.hallucinated
    assert v.spans == () and v.span_decision is not None
    assert (
        v.span_decision.judge == "cortex" and "calls this answer faithful" in v.span_decision.note
    )
    flagged = {**verdicts, "raglens": _verdict("raglens", None, p=0.9)}  # 2 of 3
    v = answer_verdict(ex, dets, flagged, set_name="custom")  # type: ignore[arg-type]
    assert v.hallucinated and [s.text for s in v.spans] == ["1912"]


# -- choosing the rule in cross-validation ---------------------------------------------


def _corpus(n: int = 60, seed: int = 0) -> tuple[list[RAGExample], list[Verdict], list[int]]:
    """Answers whose gold span is one number, scored by a noisy but informative judge;
    half faithful (no span), whose numbers score lower."""
    rng = np.random.default_rng(seed)
    exs, vs, folds = [], [], []
    for i in range(n):
        text = f"The bridge number {i} was built in {1800 + i} by a team of masons."
        hall = i % 2 == 0
        year = str(1800 + i)
        a = text.index(year)
        spans = (Span(start=a, end=a + 4),) if hall else ()
        offs = _tokens(text)
        tok = np.clip(rng.normal(0.15, 0.08, len(offs)), 0.01, 0.99)
        j = next(k for k, (s, e) in enumerate(offs) if text[s:e].strip() == year)
        tok[j] = 0.85 if hall else 0.35
        p = float(np.clip(rng.normal(0.7 if hall else 0.3, 0.15), 0.01, 0.99))
        exs.append(_example(spans, label=hall, id=f"a{i}", response=text, group=f"s{i}"))
        vs.append(
            Verdict(
                detector="ensemble",
                example_id=f"a{i}",
                score=p,
                hallucinated=p >= 0.5,
                token_scores=tok,
                token_offsets=offs,
            )
        )
        folds.append(i % 5)
    return exs, vs, folds


def test_the_rule_chosen_in_cross_validation_beats_flagging_everything_and_spares_faithful_answers() -> (
    None
):
    exs, vs, folds = _corpus()
    got = choose_span_rule(
        exs, vs, [0.5] * len(exs), folds, [e.provenance.group for e in exs], n_boot=200
    )
    assert got is not None
    nested, every = got["nested"], got["flag_everything"]
    assert nested["f1"] > 0.6 > every["f1"]
    assert nested["faithful_share"] <= MAX_FAITHFUL_SHARE
    lo, hi = nested["f1_ci"]
    assert lo <= nested["f1"] <= hi
    rule = recorded_rule(got, "run-x", ["t"])
    assert rule.chosen == "cross-validation" and rule.measured["run"] == "run-x"
    assert rule.measured["f1"] == pytest.approx(nested["f1"])
    assert 0.35 < rule.threshold <= 0.85  # between the faithful numbers and the hallucinated
    assert len(got["folds"]) == 5
    (per,) = got["by_dataset"].values()  # one dataset: the pooled numbers
    assert per["n"] == len(exs) and per["f1"] == pytest.approx(nested["f1"])
    assert per["flag_everything_f1"] == pytest.approx(every["f1"])

    # gold spans that are whole sentences: the rule chosen widens to them, and says so
    sents = []
    for e in exs:
        if e.spans:
            end = e.response.index(".") + 1
            e = _example(
                (Span(start=0, end=end),),
                label=True,
                id=e.id,
                response=e.response,
                group=e.provenance.group,
            )
        sents.append(e)
    got = choose_span_rule(
        sents, vs, [0.5] * len(exs), folds, [e.provenance.group for e in exs], n_boot=0
    )
    assert got is not None and got["rule"]["extend"] == "sentence"
    assert got["nested"]["f1"] > 0.8 and all(f["extend"] == "sentence" for f in got["folds"])
    # the rule that is measured is the rule that is applied
    ex, v = exs[0], vs[0]
    spans, _ = rule_spans(ex.response, v, rule, answer_threshold=0.5)
    if v.hallucinated:
        assert [ex.response[a:b] for a, b, _ in spans] == ["1800"]


def test_no_rule_without_token_scores_or_span_labels() -> None:
    exs, vs, folds = _corpus(10)
    bare = [Verdict(detector="d", example_id=v.example_id, score=v.score) for v in vs]
    assert choose_span_rule(exs, bare, [0.5] * 10, folds, [str(i) for i in range(10)]) is None
    unlabelled = [_example(id=e.id, response=e.response, label=True) for e in exs]
    assert choose_span_rule(unlabelled, vs, [0.5] * 10, folds, [str(i) for i in range(10)]) is None
    assert math.isclose(MAX_FAITHFUL_SHARE, 0.10)
