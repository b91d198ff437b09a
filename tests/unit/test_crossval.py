"""Trustworthy evaluation: grouped stratified folds, the fitting recipe that never sees
its test fold, calibration (Platt scaling, reliability, ECE), grouped bootstrap CIs,
pooled out-of-fold metrics and the cross-domain matrix."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from typing import Any, cast

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from core.base.errors import DataError
from core.base.examples import Provenance, RAGExample, source_key
from core.data import load_builtin, stratified_head
from core.detectors.baselines import NLLDetector
from core.evaluation.crossval import (
    CROSSFIT_K,
    CVOptions,
    CVProgress,
    answer_lengths,
    cross_validate,
    default_maker,
    fit_procedure,
    inner_split,
    make_folds,
    pinned_maker,
)
from core.evaluation.cv_run import CVRun, format_span_prf
from core.evaluation.evaluate import set_thresholds
from core.evaluation.matrix import MatrixProgress, MatrixRun, domain_matrix
from core.evaluation.runs import load_run
from core.learning.calibration import (
    MAX_PLATT,
    DatasetCalibration,
    PlattCalibrator,
    dataset_family,
    expected_calibration_error,
    match_dataset,
    reliability,
)
from core.learning.contract import (
    DetectorConfig,
    Features,
    Verdict,
    decision_threshold,
    for_dataset,
)
from core.learning.metrics import (
    SPAN_F1_NOTE,
    grouped_bootstrap_ci,
    length_bins,
    matched_auroc,
    span_overlap_metrics,
)
from core.pipeline.extract import extract_features
from core.pipeline.judge import judge_stream
from core.pipeline.word_spans import detector_spans

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def examples() -> list[RAGExample]:
    return stratified_head(load_builtin(), 90)


@pytest.fixture(scope="module")
def extraction(tiny_model, examples):
    dets = [default_maker()(n) for n in ("nll", "context_gain")]
    return extract_features(tiny_model, examples, dets)


# ----------------------------------------------------------------------------- folds


def test_folds_keep_sources_together_and_both_labels_in_each(examples) -> None:
    fold = make_folds(examples, 5, seed=0)
    assert set(fold.tolist()) == set(range(5))
    by_source: dict[str, set[int]] = {}
    for e, f in zip(examples, fold, strict=True):
        by_source.setdefault(source_key(e), set()).add(int(f))
    assert all(len(v) == 1 for v in by_source.values())
    for f in range(5):
        labels = {bool(e.label) for e, g in zip(examples, fold, strict=True) if g == f}
        assert labels == {True, False}
    np.testing.assert_array_equal(fold, make_folds(examples, 5, seed=0))
    assert not np.array_equal(fold, make_folds(examples, 5, seed=1))


def test_folds_are_stratified_by_generator() -> None:
    exs = []
    for i in range(120):
        gen = ["a", "b", "c"][i % 3]
        exs.append(
            RAGExample(
                id=f"x{i}",
                question=f"q{i}",
                passages=(f"p{i}",),
                response="r",
                label=bool(i % 4 == 0),
                provenance=Provenance(generator=gen, dataset="d"),
            )
        )
    fold = make_folds(exs, 4, seed=0)
    for f in range(4):
        c = Counter(
            (e.provenance.generator, e.label) for e, g in zip(exs, fold, strict=True) if g == f
        )
        # 120 answers, 3 generators x 2 labels: each stratum lands evenly in every fold
        assert c[("a", True)] in (2, 3) and c[("b", False)] in (7, 8)  # 10 and 30 of them


def test_too_few_sources_for_the_folds_is_a_clear_error(examples) -> None:
    with pytest.raises(DataError, match="sources"):
        make_folds(examples[:3], 5)
    with pytest.raises(DataError, match="2 folds"):
        make_folds(examples, 1)


def test_inner_split_holds_out_whole_sources(examples) -> None:
    fit, val = inner_split(examples, 0.2, seed=0)
    assert set(fit.tolist()).isdisjoint(val.tolist())
    assert len(fit) + len(val) == len(examples)
    fs = {source_key(examples[i]) for i in fit}
    assert fs.isdisjoint({source_key(examples[i]) for i in val})
    assert 0.1 < len(val) / len(examples) < 0.35


# ----------------------------------------------------------------------------- calibration


def test_a_platt_fit_on_separated_scores_stays_loadable() -> None:
    """Scores that separate the classes (a detector 30 reviewed answers agree with, its
    scores a hair apart) would drive the slope past what a saved calibrator may hold:
    the fit regularises until it is within, so what is written is read back."""
    s = np.r_[np.linspace(0.48, 0.495, 15), np.linspace(0.505, 0.52, 15)]
    y = np.r_[np.zeros(15), np.ones(15)]
    cal = PlattCalibrator().fit(s, y)
    assert 0 < cal.a_ <= MAX_PLATT and abs(cal.b_) <= MAX_PLATT
    back = PlattCalibrator.from_json(json.loads(json.dumps(cal.to_json())))
    assert roc_auc_score(y, back.transform(s)) == 1.0


def test_platt_calibration_fixes_overconfident_scores_and_keeps_the_ranking() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(2000) < 0.2).astype(int)
    z = rng.normal(size=2000) + 1.5 * y
    raw = 1 / (1 + np.exp(-(3 * z + 2)))  # overconfident and shifted
    cal = PlattCalibrator().fit(raw, y)
    p = cal.transform(raw)
    assert cal.a_ > 0
    assert expected_calibration_error(y, p) < 0.03 < expected_calibration_error(y, raw)
    assert roc_auc_score(y, p) == pytest.approx(roc_auc_score(y, raw))
    assert cal.transform(cal.inverse(0.3)) == pytest.approx(0.3, abs=1e-6)
    back = PlattCalibrator.from_json(json.loads(json.dumps(cal.to_json())))
    np.testing.assert_allclose(back.transform(raw), p)
    for bad in (
        {"kind": "platt", "a": "1", "b": 0},
        {"kind": "iso"},
        {"kind": "platt", "a": float("nan"), "b": 0},
        {"kind": "platt", "a": True, "b": 0},
    ):
        with pytest.raises(DataError):
            PlattCalibrator.from_json(bad)
    with pytest.raises(DataError, match="faithful and hallucinated"):
        PlattCalibrator().fit([0.1, 0.2], [0, 0])
    # scores that rank the wrong way are not turned round: they get the base rate
    flipped = PlattCalibrator().fit(1 - raw, y)
    assert flipped.a_ == 0 and flipped.transform(0.3) == pytest.approx(y.mean())


def test_reliability_by_hand() -> None:
    y = np.asarray([0, 0, 1, 1, 1])
    p = np.asarray([0.05, 0.15, 0.15, 0.95, 1.0])
    r = reliability(y, p, n_bins=10)
    assert r.counts.tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 0, 2]
    assert r.mean_predicted[1] == pytest.approx(0.15) and r.observed[1] == pytest.approx(0.5)
    want = (1 * 0.05 + 2 * abs(0.15 - 0.5) + 2 * abs(0.975 - 1.0)) / 5
    assert r.ece == pytest.approx(want)
    assert np.isnan(r.observed[4])


def test_grouped_bootstrap_resamples_whole_groups() -> None:
    rng = np.random.default_rng(1)
    y = np.tile([0, 1], 50)
    groups = np.repeat(np.arange(10), 10)
    # answers to one source share an offset: they are not independent evidence
    s = y + 1.5 * rng.normal(size=10)[groups] + rng.normal(scale=0.5, size=100)
    lone = grouped_bootstrap_ci(y, s, np.arange(100), n_boot=400)
    big = grouped_bootstrap_ci(y, s, groups, n_boot=400)
    point = roc_auc_score(y, s)
    assert lone[0] < point < lone[1] and big[0] < point < big[1]
    assert big[1] - big[0] > lone[1] - lone[0]
    assert grouped_bootstrap_ci(np.zeros(5), np.ones(5), np.arange(5)) is None


def test_set_thresholds_calibrates_only_on_the_flagged_answers(
    tiny_model, examples, extraction
) -> None:
    feats = list(extraction.features["nll"])
    exs = list(extraction.examples)
    det = NLLDetector().fit(feats[:60], exs[:60])
    held = exs[60:]
    # every other faithful and every other hallucinated answer calibrates
    use = [sum(h.label == e.label for h in held[:i]) % 2 == 0 for i, e in enumerate(held)]
    verdicts = set_thresholds(
        det, feats[60:], exs[60:], criterion="balanced_accuracy", calibrate=use
    )
    assert det.calibration_ is not None and det.calibration_.n_ == sum(use)
    v = verdicts[0]
    assert v.raw_score is not None
    assert v.score == pytest.approx(float(det.calibration_.transform(v.raw_score)))
    assert v.hallucinated == (v.score >= det.threshold_)


def test_calibration_travels_with_the_artifact(tmp_path, examples, extraction) -> None:
    feats = list(extraction.features["nll"])
    exs = list(extraction.examples)
    det = fit_procedure(default_maker(), "nll", feats, exs, calibrate_on=["builtin"])
    assert det.train_info_["procedure"]["calibrate_on"] == ["builtin"]
    det.save(tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "cfg.json").read_text())
    assert cfg["calibration"]["kind"] == "platt"
    back = NLLDetector.load(tmp_path / "a")
    a, b = det.predict(feats[0]), back.predict(feats[0])
    assert a.score == pytest.approx(b.score) and a.raw_score == pytest.approx(b.raw_score)
    cfg["calibration"] = {"kind": "platt", "a": "x", "b": 1}
    (tmp_path / "a" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match="Platt"):
        NLLDetector.load(tmp_path / "a")
    with pytest.raises(DataError, match="calibrate on"):
        fit_procedure(default_maker(), "nll", feats, exs, calibrate_on=["elsewhere"])


# ----------------------------------------------------------------------------- CV


class _Spy(NLLDetector):
    """NLL that records which answers each instance learned from and judged."""

    log: list[dict[str, set[str]]] = []

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.seen = {"fit": set(), "predict": set()}
        _Spy.log.append(self.seen)

    def fit(self, features, examples):
        self.seen["fit"] |= {e.id for e in examples}
        return super().fit(features, examples)

    def predict(self, features: Features):
        self.seen["predict"].add(features.example_id)
        return super().predict(features)


@pytest.mark.parametrize("calibration", ["crossfit", "split"])
def test_the_held_out_fold_never_reaches_fit(tiny_model, examples, extraction, calibration) -> None:
    _Spy.log = []
    run = cross_validate(
        tiny_model,
        ["nll"],
        examples,
        CVOptions(k=4, n_boot=50, calibration=calibration),
        make=lambda n: _Spy(),
        extraction=extraction,
    )
    assert run.calibration == calibration
    fold = np.asarray(run.fold)
    ids = np.asarray(run.ids)
    fitted = [s for s in _Spy.log if s["fit"]]
    # Per fold: the detector kept, then (cross-fitting) one per inner fold.
    per_fold = 1 + (CROSSFIT_K if calibration == "crossfit" else 0)
    assert len(fitted) == 4 * per_fold
    judged: Counter[str] = Counter()
    for j, seen in enumerate(fitted):
        f, inner = divmod(j, per_fold)
        test = set(ids[fold == f].tolist())
        train = set(ids[fold != f].tolist())
        assert seen["fit"].isdisjoint(test)
        if inner:  # a cross-fitting model: judges training answers it never learned from
            assert seen["predict"] <= train and seen["predict"].isdisjoint(seen["fit"])
        else:
            assert seen["predict"] <= train | test  # validation answers come from training
            judged.update(seen["predict"] & test)
    assert set(judged) == set(run.ids) and set(judged.values()) == {1}


def test_crossfit_calibrates_on_every_training_answer(examples, extraction) -> None:
    feats, exs = list(extraction.features["nll"]), list(extraction.examples)
    cross = fit_procedure(default_maker(), "nll", feats, exs)
    split = fit_procedure(default_maker(), "nll", feats, exs, calibration="split")
    pc, ps = cross.train_info_["procedure"], split.train_info_["procedure"]
    assert pc["calibration"] == "crossfit" and ps["calibration"] == "split"
    assert pc["n_calibration"] == len(exs) == pc["n_fit"] + pc["n_validation"]
    assert ps["n_calibration"] == ps["n_validation"] < len(exs)
    assert cross.calibration_.n_ == len(exs) and split.calibration_.n_ == ps["n_validation"]
    # Same learner on the same fitting part: only the calibration differs.
    a, b = cross.predict(feats[0]), split.predict(feats[0])
    assert a.raw_score == pytest.approx(b.raw_score)
    with pytest.raises(DataError, match="unknown calibration"):
        fit_procedure(default_maker(), "nll", feats, exs, calibration=cast(Any, "isotonic"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ChoiceConfig(DetectorConfig):
    choice: str = "free"


class _Choosing(NLLDetector):
    """NLL that 'chooses' on validation (``pinned`` names its choice) and records the
    config of every instance fitted."""

    Config = _ChoiceConfig
    built: list[str] = []

    def fit(self, features, examples):
        _Choosing.built.append(self.config.choice)
        return super().fit(features, examples)

    def pinned(self):
        return {"choice": "kept"}


def test_crossfit_refits_with_the_kept_detectors_choices_pinned(examples, extraction) -> None:
    """The detectors refitted for cross-fitted calibration get the kept detector's
    choices (``pinned``), so the calibrator learns scores of the same form; split
    calibration refits nothing."""
    feats, exs = list(extraction.features["nll"]), list(extraction.examples)
    _Choosing.built = []
    fit_procedure(lambda n: _Choosing(), "nll", feats, exs)
    assert _Choosing.built == ["free"] + ["kept"] * CROSSFIT_K
    _Choosing.built = []
    fit_procedure(lambda n: _Choosing(), "nll", feats, exs, calibration="split")
    assert _Choosing.built == ["free"]
    make = default_maker()
    assert pinned_maker(make, {}) is make


def test_cross_validation_pools_out_of_fold_scores(
    tiny_model, examples, extraction, tmp_path
) -> None:
    run = cross_validate(
        tiny_model,
        ["nll", "context_gain"],
        examples,
        CVOptions(k=3, n_boot=100),
        extraction=extraction,
    )
    y = np.asarray(run.labels)
    for r in run.results:
        s = np.asarray(r.scores)
        assert ((s >= 0) & (s <= 1)).all()
        assert r.pooled["auroc"] == pytest.approx(roc_auc_score(y, s))
        lo, hi = r.pooled["auroc_ci"]
        assert lo <= r.pooled["auroc"] <= hi
        assert r.pooled["ece"] == pytest.approx(reliability(y, s).ece)
        assert len(r.folds) == 3 and sum(f["n"] for f in r.folds) == len(y)
        fold = np.asarray(run.fold)
        for f in range(3):  # calibration never reverses a fold's ranking
            m = fold == f
            raw = np.asarray(r.raw_scores)[m]
            assert np.all(np.diff(s[m][np.argsort(raw)]) >= -1e-12)
        assert set(r.by_dataset) == {"builtin"}
        assert r.token is not None and r.token["n_tokens"] > 0
    path, md = run.save(tmp_path)
    back = load_run(path)
    assert isinstance(back, CVRun)
    assert json.loads(json.dumps(back.to_dict())) == json.loads(json.dumps(run.to_dict()))
    text = md.read_text()
    assert "| nll |" in text and "± " in text
    assert set(run.to_frame()["detector"]) == {"nll", "context_gain"}


def test_domain_matrix_on_two_tasks(tiny_model, examples, tmp_path) -> None:
    by_task = {
        "qa": [e for e in examples if e.task == "qa"],
        "summary": [e for e in examples if e.task == "summary"],
    }
    # give each part its own dataset name, as two files would
    parts = {
        name: [
            dataclasses.replace(
                e,
                provenance=dataclasses.replace(e.provenance, dataset=name, split=None),
            )
            for e in exs
        ]
        for name, exs in by_task.items()
    }
    steps: list[str] = []
    with pytest.raises(DataError, match="--calibration split"):  # too few sources to cross-fit
        domain_matrix(tiny_model, ["nll"], parts, CVOptions(k=2, n_boot=30))
    m = domain_matrix(
        tiny_model,
        ["nll"],
        parts,
        CVOptions(k=2, n_boot=30, calibration="split"),
        progress=MatrixProgress(step=steps.append),
    )
    cells = m.cells["nll"]
    assert set(cells["qa"]) == {"qa", "summary"} and set(cells["summary"]) == {"qa", "summary"}
    assert cells["qa"]["summary"]["n"] == len(parts["summary"])
    assert any("train on qa" in s for s in steps)
    table = m.frame("nll")
    assert list(table.columns) == ["qa", "summary"] and table.shape == (2, 2)
    path, _ = m.save(tmp_path)
    assert isinstance(load_run(path), MatrixRun)

    # Resuming: a run killed after its first training saved that training's test
    # scores; the rerun reads them back (and the diagonal's folds) and refits the
    # rest, with the same cells as the run never interrupted.
    fits: list[str] = []

    def counting(limit: int):
        return _dying_maker(fits, limit)

    folder = tmp_path / "matrix-folds"
    opts = CVOptions(k=2, n_boot=30, calibration="split", checkpoint=folder)
    resumed = MatrixProgress(resumed=lambda line: back.append(line))
    with pytest.raises(_Dies):
        domain_matrix(tiny_model, ["nll"], parts, opts, make=counting(1))
    assert len(list(folder.glob("*.npz"))) == 1  # the first training, tested on the other
    back: list[str] = []
    again = domain_matrix(tiny_model, ["nll"], parts, opts, make=counting(10**6), progress=resumed)
    assert back == ["nll: train on qa (read back from its checkpoint)"]
    assert again.cells == m.cells
    n_fits = len(fits)
    back.clear()
    third = domain_matrix(tiny_model, ["nll"], parts, opts, make=counting(10**6), progress=resumed)
    assert len(fits) == n_fits  # nothing refitted: both trainings and every diagonal fold
    assert back == [
        "nll: train on qa (read back from its checkpoint)",
        "nll: train on summary (read back from its checkpoint)",
    ]
    assert third.cells == m.cells
    # another seed names other checkpoints
    back.clear()
    domain_matrix(tiny_model, ["nll"], parts, dataclasses.replace(opts, seed=1), progress=resumed)
    assert back == []


# ----------------------------------------------------------------------------- length


def test_length_matched_auroc_sees_only_what_length_does_not() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, 400).astype(float)
    y = (rng.random(400) < lengths / 250).astype(int)  # longer answers hallucinate more
    bins = length_bins(lengths, 5)
    assert set(bins.tolist()) == {0, 1, 2, 3, 4}
    assert all(abs((bins == b).sum() - 80) <= 8 for b in range(5))
    # a score that only measures length ranks well overall, at chance within length bins
    assert roc_auc_score(y, lengths) > 0.65
    assert matched_auroc(y, lengths, bins) < roc_auc_score(y, lengths) - 0.1
    # a score that knows the labels stays perfect when matched
    assert matched_auroc(y, y + 0.01 * lengths / 200, bins) == pytest.approx(1.0)
    # by hand: pair-weighted mean of per-bin AUROCs
    s = rng.random(400)
    num = den = 0.0
    for b in range(5):
        m = bins == b
        pairs = y[m].sum() * (1 - y[m]).sum()
        num += roc_auc_score(y[m], s[m]) * pairs
        den += pairs
    assert matched_auroc(y, s, bins) == pytest.approx(num / den)
    assert matched_auroc(np.zeros(4), s[:4], bins[:4]) is None


def test_cv_run_reports_the_length_baseline(tiny_model, examples, extraction) -> None:
    run = cross_validate(
        tiny_model,
        ["nll"],
        examples,
        CVOptions(k=3, n_boot=30, calibration="split"),
        extraction=extraction,
    )
    lengths = answer_lengths(extraction.examples)
    base = run.baseline["answer_length"]
    assert base["auroc"] == pytest.approx(roc_auc_score(run.labels, lengths))
    r = run.result("nll")
    assert r.pooled["auroc_length_matched"] == pytest.approx(
        matched_auroc(np.asarray(run.labels), np.asarray(r.scores), length_bins(lengths))
    )
    md = run.to_markdown()
    assert "Answer length alone (words) reaches AUROC" in md and "length-matched" in md
    assert "AUROC length-matched" in run.to_frame().columns
    back = CVRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back.baseline == run.baseline


# ----------------------------------------------------------------------------- per dataset


def _as_datasets(exs: list[RAGExample], sizes: dict[str, int]) -> list[RAGExample]:
    """The answers relabelled as coming from datasets of these sizes, in order."""
    out, i = [], 0
    for name, n in sizes.items():
        for e in exs[i : i + n]:
            out.append(
                dataclasses.replace(e, provenance=dataclasses.replace(e.provenance, dataset=name))
            )
        i += n
    return out


def test_each_dataset_with_enough_answers_gets_its_own_calibration(
    tmp_path, examples, extraction
) -> None:
    feats, exs = list(extraction.features["nll"]), list(extraction.examples)
    mixed = _as_datasets(exs, {"a": 44, "b": 40, "c": len(exs) - 84})
    det = fit_procedure(default_maker(), "nll", feats, mixed)
    own = det.dataset_calibration_
    assert set(own) == {"a", "b"}  # "c" has too few answers for a calibration of its own
    assert own["a"].n == 44 and own["b"].n == 40
    assert own["a"].n_positive == sum(e.label for e in mixed[:44])
    # Each is fitted on its own answers' cross-fitted raw scores: the pooled calibrator
    # is fitted on all of them, so it differs from both.
    assert own["a"].calibrator.to_json() != det.calibration_.to_json()
    v = det.predict(feats[0])
    a = for_dataset(det, v, "a")
    assert a.calibrated_for == "a" and a.raw_score == v.raw_score
    assert a.score == pytest.approx(float(own["a"].calibrator.transform(v.raw_score)))
    if own["a"].calibrator.flat:  # no signal on "a" (a random tiny model): no call
        assert a.hallucinated is None and a.no_signal is not None
    else:
        assert a.hallucinated == (a.score >= own["a"].threshold)
    assert decision_threshold(det, a) == own["a"].threshold
    for other in ("c", "elsewhere", None):  # no calibration of its own: the pooled one
        assert for_dataset(det, v, other) is v
    assert decision_threshold(det, v) == det.threshold_

    # It travels with the artifact; a damaged entry is an error naming the dataset.
    det.save(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "cfg.json").read_text())
    assert set(cfg["calibration_by_dataset"]) == {"a", "b"}
    back = NLLDetector.load(tmp_path / "m")
    b = for_dataset(back, back.predict(feats[0]), "b")
    assert b.score == pytest.approx(for_dataset(det, v, "b").score)
    bad = [
        (
            {
                **cfg["calibration_by_dataset"],
                "b": {**cfg["calibration_by_dataset"]["b"], "threshold": 2},
            },
            "'b'",
        ),
        ({"b": {**cfg["calibration_by_dataset"]["b"], "code": "os.system"}}, "'b'"),
        ({f"d{i}": cfg["calibration_by_dataset"]["a"] for i in range(65)}, "at most 64"),
        (["a"], "must map"),
    ]
    for value, match in bad:
        (tmp_path / "m" / "cfg.json").write_text(
            json.dumps({**cfg, "calibration_by_dataset": value})
        )
        with pytest.raises(DataError, match=match) as raised:
            NLLDetector.load(tmp_path / "m")
        assert str(tmp_path / "m") in str(raised.value)
        assert "`ragscope train --detectors nll`" in str(raised.value)
    no_pooled = {k: v for k, v in cfg.items() if k != "calibration"}
    (tmp_path / "m" / "cfg.json").write_text(json.dumps(no_pooled))
    with pytest.raises(DataError, match="without a pooled calibration.*ragscope train"):
        NLLDetector.load(tmp_path / "m")

    # One dataset: the pooled calibration is that dataset's; nothing more is kept.
    assert fit_procedure(default_maker(), "nll", feats, exs).dataset_calibration_ == {}


def test_another_split_of_a_training_dataset_gets_its_calibration() -> None:
    """A held-out ``ragtruth_qa_test`` is judged with the ``ragtruth_qa_dev`` calibration
    (its family); a name matching no family, or two, keeps the pooled one."""
    cal = lambda t: DatasetCalibration(  # noqa: E731
        calibrator=PlattCalibrator().fit(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])),
        threshold=t,
        n=40,
        n_positive=10,
    )
    own = {"ragtruth_qa_dev": cal(0.3), "finqa_qwen3_interpdetect": cal(0.6), "builtin": cal(0.5)}
    assert dataset_family("RAGTruth_QA-Test") == "ragtruth_qa"
    assert match_dataset(own, "ragtruth_qa_dev") == ("ragtruth_qa_dev", own["ragtruth_qa_dev"])
    for held_out in ("ragtruth_qa_test", "ragtruth_qa_heldout", "ragtruth_qa.val"):
        assert match_dataset(own, held_out)[0] == "ragtruth_qa_dev"  # type: ignore[index]
    for other in ("ragtruth_summary_test", "finqa_test", "heldout", "", None):
        assert match_dataset(own, other) is None
    # Two training datasets of one family: ambiguous, so the pooled calibration.
    assert match_dataset({"x_dev": cal(0.3), "x_train": cal(0.4)}, "x_test") is None

    class Det:
        dataset_calibration_ = own
        threshold_ = 0.5

    v = Verdict(detector="d", example_id="e", score=0.5, hallucinated=False, raw_score=0.7)
    judged = for_dataset(Det(), v, "ragtruth_qa_test")
    assert judged.calibrated_for == "ragtruth_qa_dev"
    assert judged.hallucinated == (judged.score >= 0.3)
    assert decision_threshold(Det(), judged) == 0.3


def test_cv_reports_each_datasets_own_calibration(tiny_model, examples, extraction) -> None:
    exs = list(extraction.examples)
    mixed = _as_datasets(exs, {"a": 46, "b": len(exs) - 46})
    ext = dataclasses.replace(extraction, examples=tuple(mixed))
    run = cross_validate(
        None, ["nll"], mixed, CVOptions(k=2, n_boot=20), extraction=ext, model_key="m"
    )
    by = run.result("nll").by_dataset
    assert set(by) == {"a", "b"}
    for m in by.values():
        assert 0.0 <= m["own_ece"] <= 1.0 and m["own_balanced_accuracy"] is not None
        # the AUROC of the answers as each dataset's own calibration (and stacker) reads them
        lo, hi = m["own_auroc_ci"]
        assert lo <= m["own_auroc"] <= hi
        assert f"→ {m['own_auroc']:.3f} [{lo:.3f}, {hi:.3f}] / " in run.to_markdown()
    assert "→" in run.to_markdown()
    assert "Too few answers" not in run.to_markdown()
    # A part of one class says so under the table instead of passing its numbers as facts.
    sets_of = run.example_datasets
    one_class = dataclasses.replace(
        run, labels=tuple(0 if d == "b" else y for d, y in zip(sets_of, run.labels, strict=True))
    )
    n_b = sum(d == "b" for d in sets_of)
    assert f"**Too few answers.** b's answers hold {n_b} answers, all faithful" in (
        one_class.to_markdown()
    )
    # Each dataset's AUROC carries its own source-grouped bootstrap interval, over that
    # dataset's answers alone (a part's AUROC is a statistic from fewer answers).
    for name, m in by.items():
        lo, hi = m["auroc_ci"]
        assert lo <= m["auroc"] <= hi, name
        assert f"{m['auroc']:.3f} [{lo:.3f}, {hi:.3f}]" in run.to_markdown()
    # Restored from its JSON, the run keeps them; without resamples there are none.
    assert (
        CVRun.from_dict(run.to_dict()).result("nll").by_dataset["a"]["auroc_ci"]
        == by["a"]["auroc_ci"]
    )
    plain = cross_validate(
        None, ["nll"], mixed, CVOptions(k=2, n_boot=0), extraction=ext, model_key="m"
    )
    assert "auroc_ci" not in plain.result("nll").by_dataset["a"]


def test_cv_reports_each_datasets_token_ap(extraction) -> None:
    exs = list(extraction.examples)
    one = cross_validate(
        None, ["nll"], exs, CVOptions(k=2, n_boot=0), extraction=extraction, model_key="m"
    )
    only = one.result("nll")
    (name,) = only.by_dataset
    assert only.by_dataset[name]["token_ap"] == pytest.approx(only.token["ap"])
    assert only.by_dataset[name]["token_auroc"] == pytest.approx(only.token["auroc"])
    # One dataset: its span metrics are the run's.
    assert only.spans is not None and only.by_dataset[name]["spans"] == only.spans

    # Dataset "a" loses its gold spans: its tokens are all faithful, so no token AP.
    mixed = [
        dataclasses.replace(
            e,
            spans=() if i < 40 else e.spans,
            provenance=dataclasses.replace(e.provenance, dataset="a" if i < 40 else "b"),
        )
        for i, e in enumerate(exs)
    ]
    ext = dataclasses.replace(extraction, examples=tuple(mixed))
    run = cross_validate(
        None, ["nll"], mixed, CVOptions(k=2, n_boot=0), extraction=ext, model_key="m"
    )
    by = run.result("nll").by_dataset
    assert by["a"]["token_ap"] is None and by["a"]["token_auroc"] is None
    assert 0.0 <= by["b"]["token_ap"] <= 1.0
    assert "token AP" in run.to_markdown()
    assert any(e.spans for e in mixed[40:])
    # Spans per dataset: "a" holds no gold span, so no span F1; "b" holds every gold
    # and overlapping character of the run, and the markdown prints its P/R/F1.
    pooled = run.result("nll").spans
    assert pooled is not None and by["a"]["spans"] is None
    assert 0.0 <= by["b"]["spans"]["f1"] <= 1.0
    for key in ("gold_chars", "overlap_chars"):
        assert by["b"]["spans"][key] == pooled[key], key
    assert by["b"]["spans"]["predicted_chars"] <= pooled["predicted_chars"]
    assert f"span P/R/F1 {format_span_prf(by['b']['spans'])}" in run.to_markdown()


def test_an_answer_of_a_training_dataset_is_judged_by_its_own_calibration(
    tiny_model, examples, extraction
) -> None:
    feats, exs = list(extraction.features["nll"]), list(extraction.examples)
    mixed = _as_datasets(exs, {"a": 44, "b": len(exs) - 44})
    det = fit_procedure(default_maker(), "nll", feats, mixed)
    own = det.dataset_calibration_["b"]

    def judged(example: RAGExample):
        steps = [j for j in judge_stream(tiny_model, example, [det]) if j.verdict is not None]
        return steps[0].verdict

    in_b, elsewhere = judged(mixed[-1]), judged(exs[-1])  # the same answer, two datasets
    assert in_b.calibrated_for == "b" and elsewhere.calibrated_for is None
    assert in_b.raw_score == pytest.approx(elsewhere.raw_score)
    assert in_b.score == pytest.approx(own.apply(in_b.raw_score))
    assert elsewhere.score == pytest.approx(float(det.calibration_.transform(in_b.raw_score)))


# ----------------------------------------------------------------------------- resuming


class _Dies(Exception):
    pass


def _dying_maker(fits: list[str], limit: int):
    """The default detectors, each fit recorded in ``fits``; past ``limit`` fits in all
    the next one raises :class:`_Dies` (a run killed mid-way)."""

    def make(n: str):
        det = default_maker()(n)
        fit = det.fit

        def counted(*a, **k):
            fits.append(n)
            if len(fits) > limit:
                raise _Dies
            return fit(*a, **k)

        det.fit = counted  # type: ignore[method-assign]
        return det

    return make


def test_an_interrupted_cross_validation_resumes_after_its_last_fold(
    examples, extraction, tmp_path
) -> None:
    """A run killed in fold 3 saved folds 1-2; the rerun refits only folds 3-4 and
    gives the same numbers as a run never interrupted; a damaged checkpoint is refitted,
    and another config never reads this one's folds."""
    exs = list(extraction.examples)
    kw: dict[str, Any] = dict(extraction=extraction, model_key="m")
    opts = CVOptions(k=4, n_boot=20)
    whole = cross_validate(None, ["nll"], exs, opts, **kw)
    fits: list[str] = []

    def dying(limit: int):
        return _dying_maker(fits, limit)

    per_fold = 1 + CROSSFIT_K  # the kept fit and the cross-fitting ones
    folder = tmp_path / "folds"
    back: list[int] = []

    def rerun() -> CVRun:
        back.clear()
        fits.clear()
        return cross_validate(
            None,
            ["nll"],
            exs,
            dataclasses.replace(opts, checkpoint=folder),
            make=dying(10**6),
            progress=CVProgress(resumed=lambda d, f, k: back.append(f)),
            **kw,
        )

    with pytest.raises(_Dies):
        cross_validate(
            None,
            ["nll"],
            exs,
            dataclasses.replace(opts, checkpoint=folder),
            make=dying(2 * per_fold + 1),
            **kw,
        )
    assert len(list(folder.glob("*.npz"))) == 2
    again = rerun()
    assert back == [0, 1] and len(fits) == 2 * per_fold
    stamp = ("name", "created_at")
    assert {k: v for k, v in json.loads(json.dumps(again.to_dict())).items() if k not in stamp} == {
        k: v for k, v in json.loads(json.dumps(whole.to_dict())).items() if k not in stamp
    }
    assert len(list(folder.glob("*.npz"))) == 4

    # A damaged or foreign checkpoint is refitted, not trusted.
    files = sorted(folder.glob("*.npz"))
    files[0].write_bytes(b"PK\x03\x04 not a zip")
    files[1].write_bytes(files[2].read_bytes())  # another fold's answers
    third = rerun()
    assert len(back) == 2 and len(fits) == 2 * per_fold
    assert third.result("nll").scores == whole.result("nll").scores

    # Another seed (other folds) or calibration names other checkpoints.
    back.clear()
    cross_validate(
        None,
        ["nll"],
        exs,
        dataclasses.replace(opts, checkpoint=folder, calibration="split"),
        progress=CVProgress(resumed=lambda d, f, k: back.append(f)),
        **kw,
    )
    assert back == []


def test_fold_checkpoints_round_trip_token_scores(tmp_path) -> None:
    from core.evaluation.foldstore import fold_result, load_fold, save_fold

    vs = [
        Verdict(
            detector="d",
            example_id=f"e{i}",
            score=0.1 * i,
            hallucinated=i > 1,
            token_scores=None if i == 0 else np.linspace(0, 1, i + 2).astype(np.float32),
            token_offsets=None if i == 0 else np.arange(2 * (i + 2)).reshape(-1, 2),
            raw_score=None if i == 1 else 0.5,
        )
        for i in range(4)
    ]
    test = np.asarray([3, 5, 8, 9])
    r = fold_result(test, vs, vs, 0.25, "abc", 0.375)
    save_fold(tmp_path, "k", r)
    got = load_fold(tmp_path, "k", test)
    assert got is not None and got.threshold == 0.25 and got.config_hash == "abc"
    assert got.token_threshold == 0.375
    save_fold(tmp_path, "none", fold_result(test, vs, vs, 0.25, "abc"))
    assert (none := load_fold(tmp_path, "none", test)) is not None
    assert none.token_threshold is None
    for j, v in enumerate(vs):
        w = got.verdict(j, "d", v.example_id)
        assert w.score == v.score and w.hallucinated == v.hallucinated
        assert w.raw_score == (v.raw_score if v.raw_score is not None else v.score)
        if v.token_scores is None:
            assert w.token_scores is None and w.token_offsets is None
        else:
            np.testing.assert_array_equal(w.token_scores, v.token_scores)
            np.testing.assert_array_equal(w.token_offsets, v.token_offsets)
    assert load_fold(tmp_path, "k", test[:3]) is None  # other test answers
    assert load_fold(tmp_path, "missing", test) is None
    (tmp_path / "big.npz").write_bytes(b"\0" * 64)
    assert load_fold(tmp_path, "big", test) is None


def test_stale_fold_checkpoints_are_pruned(tmp_path) -> None:
    """A stopped command's checkpoints go once untouched for STALE_DAYS; a folder with
    one recent file, and stray files, stay."""
    from core.evaluation.foldstore import STALE_DAYS, prune_stale

    old, fresh, mixed = (tmp_path / n for n in ("old", "fresh", "mixed"))
    for d in (old, fresh, mixed):
        d.mkdir()
        (d / "a.npz").write_bytes(b"x")
    (mixed / "b.npz").write_bytes(b"y")
    (tmp_path / "stray.txt").write_text("keep")
    past = time.time() - (STALE_DAYS + 1) * 86400
    for f in (old / "a.npz", old, mixed / "a.npz", mixed):
        os.utime(f, (past, past))
    assert prune_stale(tmp_path) == [old]
    assert not old.exists() and fresh.exists() and mixed.exists()
    assert (tmp_path / "stray.txt").exists()
    assert prune_stale(tmp_path / "missing") == []


def test_cv_reports_span_f1_by_character_overlap_at_each_folds_token_threshold(
    extraction,
) -> None:
    """Each answer's whole-word spans at the token threshold of the fold that judged
    it, against its gold spans: the run's span P/R/F1, its markdown column and note."""
    exs = list(extraction.examples)
    made = []

    def make(name):
        det = default_maker()(name)
        made.append(det)
        return det

    run = cross_validate(
        None,
        ["nll"],
        exs,
        CVOptions(k=2, n_boot=0, calibration="split"),
        extraction=extraction,
        model_key="m",
        make=make,
    )
    fold_dets = made[-2:]  # split calibration: one fitted detector per fold, in order
    thresholds = [d.token_threshold_ for d in fold_dets]
    assert all(t is not None for t in thresholds) and thresholds[0] != thresholds[1]
    pred, gold = [], []
    for i, e in enumerate(exs):
        if not e.spans and e.label is not False:
            continue
        f = run.fold[i]
        v = fold_dets[f].predict(extraction.features["nll"][i])
        pred.append([(a, b) for a, b, _ in detector_spans(e.response, v, thresholds[f])])
        gold.append([(g.start, g.end) for g in e.spans])
    want = span_overlap_metrics(pred, gold)
    got = run.result("nll").spans
    assert got is not None
    assert got["gold_chars"] == sum(g.end - g.start for e in exs for g in e.spans)
    assert got["predicted_chars"] == want["predicted_chars"] > 0
    for k in ("precision", "recall", "f1"):
        assert got[k] == pytest.approx(want[k])
    md = run.to_markdown()
    assert "span P/R/F1 (char)" in md and SPAN_F1_NOTE in md
    cell = f"{got['precision']:.3f} / {got['recall']:.3f} / {got['f1']:.3f}"
    assert f"| {cell} |" in md
    assert run.to_frame().loc[0, "span F1 (char)"] == pytest.approx(got["f1"])
    # The field travels through the run file; a run saved before it shows "-".
    again = CVRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again.result("nll").spans == got
    old = run.to_dict()
    for r in old["results"]:
        del r["spans"]
    before = CVRun.from_dict(old)
    assert before.result("nll").spans is None
    assert "| - |" in before.to_markdown() and SPAN_F1_NOTE not in before.to_markdown()
