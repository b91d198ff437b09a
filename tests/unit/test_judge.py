"""One verdict object (core.pipeline.judge.AnswerVerdict): the overall verdict, each detector's
probability with the threshold of the same calibration, spans, and the same numbers
through judge() and judge_many()."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from core.base.examples import Provenance, RAGExample
from core.cli.judging import _summary_lines, balanced_accuracy
from core.data import builtin_examples
from core.detectors import make_detector
from core.detectors.baselines import NLLDetector
from core.learning.calibration import DatasetCalibration, PlattCalibrator
from core.learning.contract import Verdict, calibrated_as, for_dataset
from core.learning.metrics import evidence_warning
from core.pipeline.extract import extract_features
from core.pipeline.judge import (
    VOTE,
    JudgeFailure,
    answer_verdict,
    judge,
    judge_many,
    overall_verdict,
)
from core.pipeline.sets import load_set


def _v(name: str, p: float, thr: float, **kw: object) -> Verdict:
    return Verdict(
        detector=name, example_id="x", score=p, hallucinated=p >= thr, threshold=thr, **kw
    )


def test_the_ensemble_gives_the_overall_verdict_and_the_summary_says_how() -> None:
    verdicts = {
        "nll": _v("nll", 0.9, 0.5),
        "spad": _v("spad", 0.2, 0.4),
        "ensemble": _v("ensemble", 0.71, 0.38, calibrated_for="ragtruth_qa_dev"),
    }
    assert overall_verdict(verdicts) == ("ensemble", 0.71, 0.38, True, "ragtruth_qa_dev")
    ex = RAGExample(id="x", question="q?", passages=("p.",), response="An answer.")
    dets = [make_detector(n) for n in ("nll", "spad", "ensemble")]
    av = answer_verdict(ex, dets, verdicts, set_name="default")
    assert av.summary == "Hallucinated: ensemble p = 0.71 ≥ 0.38; 2 of 3 detectors flag it"
    rec = av.to_record()
    assert rec["detectors"]["ensemble"] == {
        "probability": 0.71,
        "threshold": 0.38,
        "hallucinated": True,
        "call": "flagged",
        "calibrated_for": "ragtruth_qa_dev",
        "raw_score": None,
    }
    assert (rec["hallucinated"], rec["n_flagged"], rec["n_detectors"]) == (True, 2, 3)


def test_without_an_ensemble_the_detectors_vote() -> None:
    verdicts = {"nll": _v("nll", 0.9, 0.5), "spad": _v("spad", 0.2, 0.4)}
    assert overall_verdict(verdicts) == (VOTE, 0.5, 0.5, True, None)
    ex = RAGExample(id="x", question="q?", passages=("p.",), response="An answer.")
    av = answer_verdict(ex, [make_detector("nll"), make_detector("spad")], verdicts, set_name="s")
    assert av.summary == "Hallucinated: 1 of 2 detectors flag it (≥ half)"


def test_a_probability_and_its_threshold_always_come_from_one_calibration() -> None:
    det = NLLDetector(NLLDetector.Config())
    det.threshold_ = 0.5
    det.calibration_ = PlattCalibrator.from_json({"kind": "platt", "a": 1.0, "b": 0.0, "n": 90})
    det.dataset_calibration_ = {
        "b": DatasetCalibration(
            calibrator=PlattCalibrator.from_json({"kind": "platt", "a": 4.0, "b": -1.0, "n": 46}),
            threshold=0.3,
            n=46,
            n_positive=20,
        )
    }
    raw = Verdict(detector="nll", example_id="x", score=0.5, raw_score=0.5)
    own = for_dataset(det, raw, "b_test")  # another split of training dataset b
    assert own.calibrated_for == "b" and own.threshold == 0.3
    assert own.hallucinated == (own.score >= 0.3)
    pooled = calibrated_as(det, own, None)
    assert pooled.calibrated_for is None and pooled.threshold == 0.5
    assert pooled.hallucinated == (pooled.score >= 0.5)
    with pytest.raises(AssertionError, match="disagrees"):
        dataclasses.replace(pooled, threshold=0.3, hallucinated=not pooled.hallucinated)


@pytest.fixture(scope="module")
def tiny_set(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-set")
    examples = builtin_examples()
    dets = [make_detector("nll"), make_detector("context_gain")]
    feats = extract_features(tiny_model, examples, dets).features
    for d in dets:
        d.fit(list(feats[d.name]), examples).save(out / d.name)
    return out


def test_judge_and_judge_many_give_the_same_verdicts(
    tiny_model, tiny_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(tiny_set))
    dset = load_set(tiny_model.info.key)
    assert dset.names == ("context_gain", "nll")
    examples = builtin_examples()[:3]
    too_long = dataclasses.replace(
        examples[0],
        id="too-long",
        response="word " * 5000,
        spans=(),
        label=None,
        provenance=Provenance(dataset="mine"),
    )
    many = list(judge_many(tiny_model, [examples[0], too_long, *examples[1:]], dset))
    assert [getattr(m, "example_id", None) for m in many] == [
        examples[0].id,
        "too-long",
        examples[1].id,
        examples[2].id,
    ]
    failed = many[1]
    assert isinstance(failed, JudgeFailure) and "more than the model" in str(failed.error)
    for ex, batch in zip(examples, [many[0], *many[2:]], strict=True):
        one = judge(tiny_model, ex, dset)
        assert one.judge == VOTE and one.set_name == "custom"
        assert list(one.verdicts) == ["context_gain", "nll"]
        for name, v in one.verdicts.items():
            w = batch.verdicts[name]
            assert v.threshold is not None and v.hallucinated == (v.score >= v.threshold)
            assert (w.score, w.threshold, w.hallucinated) == pytest.approx(
                (v.score, v.threshold, v.hallucinated), abs=1e-6
            )
        assert one.hallucinated == batch.hallucinated
        assert [(s.start, s.end) for s in one.spans] == [(s.start, s.end) for s in batch.spans]
        for s in one.spans:
            assert s.text == ex.response[s.start : s.end] and any(c.isalnum() for c in s.text)
    assert np.isfinite(one.seconds)


def _records(pairs: list[tuple[bool | None, bool]]) -> list[dict]:
    return [{"labels": {"hallucinated": gold}, "hallucinated": called} for gold, called in pairs]


def test_the_judge_summary_scores_as_every_report_and_says_when_answers_are_too_few() -> None:
    pairs = [(True, True), (True, False), (False, False), (None, True)] + [(False, True)] * 2
    ba, y = balanced_accuracy(_records(pairs))
    labelled = [(g, c) for g, c in pairs if g is not None]
    want = balanced_accuracy_score([int(g) for g, _ in labelled], [int(c) for _, c in labelled])
    assert ba == pytest.approx(want) and y.size == 5
    lines = _summary_lines(
        judged=6, flagged=4, failed=0, held=0, from_cache=0, seconds=1.0,
        records=_records(pairs), out="v.jsonl",
    )  # fmt: skip
    assert f"balanced accuracy of the overall verdict: {want:.3f} on 5 labelled answers" in lines
    assert lines[-1] == f"Too few answers: {evidence_warning(y, 'The labelled answers')}"
    assert "8 more answers of each class" in lines[-1]
    # One class only: undefined, and said why.
    one = _summary_lines(
        judged=2, flagged=1, failed=0, held=0, from_cache=0, seconds=1.0,
        records=_records([(True, True), (True, False)]), out="v.jsonl",
    )  # fmt: skip
    assert "balanced accuracy: undefined on 2 labelled answers (one class only)" in one
    assert "all hallucinated" in one[-1]
    # Enough of both: no warning.
    many = _records([(True, True)] * 10 + [(False, False)] * 10)
    assert not _summary_lines(
        judged=20, flagged=10, failed=0, held=0, from_cache=0, seconds=1.0,
        records=many, out="v.jsonl",
    )[-1].startswith("Too few")  # fmt: skip


def test_a_flat_calibration_makes_no_call_and_is_left_out_of_the_vote() -> None:
    """Issue 67: a calibration with no signal (flat: every score maps to the base rate,
    which is also its threshold) flagged every answer. Written by an older adaptation or
    a training whose scores ranked a dataset the wrong way, it now makes no call: the
    detector is named, left out of the vote and the counts, never a flag."""
    flat = DatasetCalibration(
        calibrator=PlattCalibrator.from_json({"kind": "platt", "a": 0.0, "b": 0.0, "n": 20}),
        threshold=0.5,
        n=20,
        n_positive=10,
    )
    assert flat.calibrator.flat and flat.apply(0.01) == flat.apply(0.99) == 0.5
    det = NLLDetector(NLLDetector.Config())
    det.threshold_ = 0.5
    det.calibration_ = PlattCalibrator.from_json({"kind": "platt", "a": 1.0, "b": 0.0, "n": 90})
    det.dataset_calibration_ = {"mine": flat}
    for raw in (0.01, 0.5, 0.99):
        pooled = Verdict(detector="nll", example_id="x", score=raw, raw_score=raw)
        v = for_dataset(det, pooled, "mine")
        assert (v.score, v.threshold, v.calibrated_for) == (0.5, 0.5, "mine")
        assert v.hallucinated is None and not v.called
        assert v.no_signal is not None and "no signal on mine" in v.no_signal
        # judged as another dataset (or pooled) it carries a signal again
        assert calibrated_as(det, v, None).no_signal is None
    verdicts = {
        "nll": for_dataset(
            det, Verdict(detector="nll", example_id="x", score=0.9, raw_score=0.9), "mine"
        ),
        "spad": _v("spad", 0.2, 0.4),
        "lexical": _v("lexical", 0.7, 0.5),
    }
    # one of the two detectors with a signal flags it: half, so the vote flags it; the
    # silent one is not a "no" (2 of 3 would not be half)
    assert overall_verdict(verdicts) == (VOTE, 0.5, 0.5, True, None)
    ex = RAGExample(id="x", question="q?", passages=("p.",), response="An answer.")
    dets = [make_detector(n) for n in ("nll", "spad", "lexical")]
    av = answer_verdict(ex, dets, verdicts, set_name="s")
    assert (av.n_flagged, av.n_voting, av.no_signal) == (1, 2, ("nll",))
    assert av.summary == (
        "Hallucinated: 1 of 2 detectors flag it (nll: no signal here, left out) (≥ half)"
    )
    rec = av.to_record()
    assert rec["n_no_signal"] == 1 and "no signal on mine" in rec["detectors"]["nll"]["no_signal"]
    assert rec["detectors"]["nll"]["hallucinated"] is None
    # an ensemble with no signal is not the judge: the others vote
    verdicts["ensemble"] = dataclasses.replace(verdicts["nll"], detector="ensemble")
    assert overall_verdict(verdicts)[0] == VOTE
    with pytest.raises(ValueError, match="no call"):
        Verdict(detector="d", example_id="x", score=0.5, hallucinated=True, no_signal="flat")
