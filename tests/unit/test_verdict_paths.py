"""A set trained on two datasets judges answers of one's held-out part by that dataset's
own calibration and threshold, through every path: judge(), judge_many(), ``ragscope
evaluate --as-trained`` (and ``ragscope judge`` / the app, tested with their commands
and pages against judge()). Tiny model, nll + context_gain trained with ``--cv 3``."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from core.analysis.heads_layers import head_view
from core.base.paths import builtin_dir
from core.cli import main
from core.data import resolve_dataset
from core.interventions import counterfactual as cf_core
from core.interventions.counterfactual import edit_example, judge_pair, score_one
from core.learning.contract import calibrated_as, judge_features
from core.pipeline.judge import AnswerVerdict, judge, judge_answer, judge_many
from core.pipeline.sets import load_set
from core.review import dataset_verdicts

DETECTORS = "nll,context_gain"


def _write(path: Path, records: list[dict], dataset: str) -> Path:
    lines = []
    for r in records:
        r = {**r, "provenance": {**r["provenance"], "dataset": dataset, "split": None}}
        lines.append(json.dumps(r))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """``(artifacts, held-out a_test file, cache dir)``: the set trained on a_dev + b_dev."""
    root = tmp_path_factory.mktemp("paths")
    groups: dict[str, list[dict]] = defaultdict(list)
    for line in (builtin_dir() / "corpus.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["task"] == "qa":
            groups[r["provenance"]["group"]].append(r)
    names = sorted(groups)
    pick = lambda a, b: [r for g in names[a:b] for r in groups[g]]  # noqa: E731
    a_dev = _write(root / "a_dev.jsonl", pick(0, 36), "a_dev")
    b_dev = _write(root / "b_dev.jsonl", pick(36, 72), "b_dev")
    a_test = _write(root / "a_test.jsonl", pick(72, 102), "a_test")
    out = root / "set"
    mp = pytest.MonkeyPatch()
    mp.setenv("RAGSCOPE_CACHE_DIR", str(root / "cache"))
    try:
        argv = ["train", "--model", "tiny", "--dataset", f"{a_dev},{b_dev}", "--cv", "3"]
        argv += ["--detectors", DETECTORS, "--out", str(out)]
        assert main(argv) == 0
    finally:
        mp.undo()
    return out, a_test, root / "cache"


def test_every_path_flags_held_out_answers_at_their_datasets_threshold(
    tiny_model, trained: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out, a_test, cache = trained
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(out))
    dset = load_set(tiny_model.info.key)
    assert dset.names == ("context_gain", "nll")
    for card in dset.detectors:
        assert card.calibrations == ("a_dev", "b_dev")
    # Each artifact records its CV's span P/R/F1 (char overlap) beside its token AP.
    spans = {c.name: c.metrics["cv"]["spans"] for c in dset.detectors}
    assert any(s and 0 <= s["f1"] <= 1 and s["n_answers"] > 0 for s in spans.values()), spans
    _, examples = resolve_dataset(str(a_test))
    assert {e.provenance.dataset for e in examples} == {"a_test"}
    many = list(judge_many(tiny_model, examples, dset))
    assert all(isinstance(v, AnswerVerdict) for v in many)
    y = np.array([bool(e.label) for e in examples])
    for card in dset.detectors:
        own = card.detector.dataset_calibration_["a_dev"]
        flags = []
        for av in many:
            v = av.verdicts[card.name]
            # a_test is another split of a_dev: a_dev's calibration and threshold judge it.
            assert v.calibrated_for == "a_dev" and v.threshold == own.threshold
            assert v.score == pytest.approx(own.apply(v.raw_score))
            if own.calibrator.flat:  # no signal on a_dev: no call, never a flag
                assert v.hallucinated is None and v.no_signal and "a_dev" in v.no_signal
            else:
                assert v.hallucinated == (v.score >= own.threshold) and v.no_signal is None
            flags.append(bool(v.hallucinated))
        ba = balanced_accuracy_score(y, flags)
        # evaluate --as-trained reports the same balanced accuracy, from the same flags.
        runs = tmp_path / card.name
        argv = ["evaluate", "--model", "tiny", "--dataset", str(a_test), "--artifacts", str(out)]
        argv += ["--as-trained", "--detectors", card.name, "--out", str(runs), "--bootstrap", "0"]
        assert main(argv) == 0
        run = json.loads(next(runs.glob("*.json")).read_text())
        res = next(r for r in run["results"] if r["detector"] == card.name)
        got = res["metrics"]
        assert got["balanced_accuracy"] == pytest.approx(ba)
        assert got["threshold"] == pytest.approx(own.threshold)
        # ... and agrees with the CV's balanced accuracy for a_dev at a_dev's own
        # threshold within a 95% interval of their difference (each balanced accuracy's
        # variance bounded by (1/(4 n_pos) + 1/(4 n_neg)) / 4; a random tiny model can
        # flag every answer alike, so no bootstrap of the held-out flags alone).
        by = card.metrics["cv"]["by_dataset"]["a_dev"]
        cv = by["own_balanced_accuracy"]
        pos, neg = int(y.sum()), int((~y).sum())
        var = (1 / pos + 1 / neg) / 16 + (
            1 / by["n_positive"] + 1 / (by["n"] - by["n_positive"])
        ) / 16
        assert abs(ba - cv) <= 1.96 * np.sqrt(var), (card.name, ba, cv)
    # The Python API's one-answer judge gives the very same verdicts.
    for ex, av in list(zip(examples, many, strict=True))[:3]:
        one = judge(tiny_model, ex, dset)
        for name, d in one.to_record()["detectors"].items():
            e = av.to_record()["detectors"][name]
            assert (d["hallucinated"], d["calibrated_for"]) == (
                e["hallucinated"],
                e["calibrated_for"],
            )
            assert (d["probability"], d["threshold"]) == pytest.approx(
                (e["probability"], e["threshold"])
            )


def test_analysis_paths_calibrate_like_the_judge(
    tiny_model, trained: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Counterfactual (score_one), Heads (head_view) and Review scan
    (dataset_verdicts) read a held-out answer with its dataset's calibration, as judge()."""
    out, a_test, cache = trained
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(out))
    dset = load_set(tiny_model.info.key)
    dets = [c.detector for c in dset.detectors]
    _, examples = resolve_dataset(str(a_test))
    examples = examples[:2]
    _, scanned = dataset_verdicts(tiny_model, examples, dset)
    for ex in examples:
        want = judge(tiny_model, ex, dset).verdicts
        side = score_one(tiny_model, dets, ex)
        heads = head_view(tiny_model, ex, detectors=dets).verdicts
        for name, v in want.items():
            assert v.calibrated_for == "a_dev"
            for got in (heads[name], scanned[ex.id][name]):
                assert got.calibrated_for == "a_dev", name
                assert (got.score, got.threshold) == pytest.approx((v.score, v.threshold))
                assert got.hallucinated == v.hallucinated
            assert side[name].score == pytest.approx(v.score)
            assert side[name].flagged == v.hallucinated


def test_a_counterfactual_pair_is_judged_from_its_own_two_traces(
    tiny_model, trained: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53: Compare traces each version once; the set's judgement of each (what every
    page shows of it) is built from those traces' features and equals judge_answer's."""
    out, a_test, cache = trained
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(out))
    dset = load_set(tiny_model.info.key)
    _, examples = resolve_dataset(str(a_test))
    ex = examples[0]
    edited = edit_example(ex, (ex.passages[0] + " " + ex.response,))
    traced: list[str] = []
    real = cf_core.run_example

    def counted(model, example, detectors, **kw):
        traced.append(example.id)
        return real(model, example, detectors, **kw)

    monkeypatch.setattr(cf_core, "run_example", counted)
    pair = judge_pair(tiny_model, dset, ex, edited, name="support")
    assert len(traced) == 2, traced  # one pass per version, nothing judged again
    cf = pair.counterfactual
    for side, scores in ((pair.original, cf.original_scores), (pair.edited, cf.edited_scores)):
        want = judge_answer(tiny_model, side.example, dset)
        assert side.judged_by is want.judged_by
        got_a, want_a = side.answer, want.answer
        assert (got_a.probability, got_a.threshold, got_a.hallucinated) == pytest.approx(
            (want_a.probability, want_a.threshold, want_a.hallucinated)
        )
        assert [(s.start, s.end) for s in got_a.spans] == [(s.start, s.end) for s in want_a.spans]
        for name, v in want.verdicts.items():
            assert v.calibrated_for == "a_dev"
            assert side.verdicts[name].score == pytest.approx(v.score)
            assert scores[name].score == pytest.approx(v.score)
            assert scores[name].flagged == v.hallucinated


def _facts(verdicts) -> dict[str, tuple]:
    """What a verdict says, comparable (its token scores are arrays)."""
    return {
        n: (v.score, v.threshold, v.calibrated_for, v.hallucinated) for n, v in verdicts.items()
    }


def test_an_answer_is_judged_as_another_datasets_by_one_rule_in_core(
    tiny_model, trained: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54: the rule that recalibrates a verdict for another training dataset, or
    hands the answer to that dataset's expert, lives in core (:meth:`Judgement.as_dataset`)
    for every caller; a page's "judge as" and the CLI read it."""
    out, a_test, cache = trained
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(out))
    dset = load_set(tiny_model.info.key)
    _, examples = resolve_dataset(str(a_test))
    ex = examples[0]
    first = judge_answer(tiny_model, ex, dset)
    assert _facts(first.answer.verdicts) == _facts(judge(tiny_model, ex, dset).verdicts)
    assert set(first.features) == set(dset.names) and first.judged_by is dset
    assert first.judge_as_options() == ["a_dev", "b_dev"]
    # 1. The set that judged judges b_dev's answers too: each detector's b_dev calibration.
    as_b = first.as_dataset("b_dev")
    for card in dset.detectors:
        want = calibrated_as(card.detector, first.verdicts[card.name], "b_dev")
        assert _facts(as_b.verdicts)[card.name] == _facts({card.name: want})[card.name]
        assert want.calibrated_for == "b_dev"
    assert as_b.answer.set_name == dset.name and as_b.first is first
    pooled = as_b.as_dataset(None)  # from the first judgement, not from b_dev's
    assert all(v.calibrated_for is None for v in pooled.verdicts.values())
    assert _facts(pooled.as_dataset("a_dev").verdicts) == _facts(
        {n: calibrated_as(dset.card(n).detector, v, "a_dev") for n, v in first.verdicts.items()}
    )
    # 2. Another set judges b_dev's answers (an expert): it predicts from the kept features.
    expert = dataclasses.replace(dset.subset(["nll"]), name="b-expert")
    routed = dataclasses.replace(dset, experts={"b_dev": expert})
    j = judge_answer(tiny_model, ex, routed)
    assert j.judged_by is routed  # a_test has no expert
    by_expert = j.as_dataset("b_dev")
    assert by_expert.judged_by is expert and by_expert.answer.set_name == "b-expert"
    assert _facts(by_expert.verdicts) == _facts(
        {"nll": judge_features(expert.card("nll").detector, j.features["nll"], "b_dev")}
    )
    assert j.judge_as_options() == ["a_dev", "b_dev"]
