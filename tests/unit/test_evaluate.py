"""Evaluation: splits by source, metrics against direct computation, thresholds, saved runs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score

from core.base.errors import DataError
from core.base.examples import Provenance, RAGExample, Span, source_key
from core.data import data_hash, split_examples
from core.detectors import detector_class
from core.evaluation.evaluate import EvalOptions, EvalRun, Splits, evaluate, list_runs
from core.learning.metrics import (
    MIN_CLASS_ANSWERS,
    best_threshold,
    evidence_warning,
    response_metrics,
    token_metrics,
)


def _ex(
    i: int, q: int, label: bool, *, split: str | None = None, group: str | None = None
) -> RAGExample:
    resp = f"Answer {i} says the bridge is {1800 + i} years old."
    spans = (
        (Span(start=resp.index(str(1800 + i)), end=resp.index(str(1800 + i)) + 4),) if label else ()
    )
    return RAGExample(
        id=f"e{i}",
        question=f"Question {q}?",
        passages=(f"Context for question {q}: the bridge was built in 1820.",),
        response=resp,
        label=label,
        spans=spans,
        provenance=Provenance(dataset="t", generator=f"gen{i % 3}", split=split, group=group),
    )


def test_sources_never_cross_splits_and_fractions_hold() -> None:
    exs = [_ex(i, q=i // 4, label=bool(i % 2)) for i in range(400)]  # 100 sources x 4 answers
    splits = split_examples(exs, seed=3)
    seen: dict[str, str] = {}
    for name, part in splits.items():
        for e in part:
            assert seen.setdefault(source_key(e), name) == name
    sizes = {k: len(v) for k, v in splits.items()}
    assert sum(sizes.values()) == 400
    assert abs(sizes["train"] / 400 - 0.7) < 0.02 and abs(sizes["test"] / 400 - 0.15) < 0.02
    assert split_examples(exs, seed=3) == splits  # deterministic
    assert split_examples(exs, seed=4) != splits


def test_declared_splits_and_groups_are_respected() -> None:
    exs = [
        _ex(i, q=i, label=bool(i % 2), split=("train", "validation", "test")[i % 3])
        for i in range(9)
    ]
    splits = split_examples(exs)
    assert [e.id for e in splits["validation"]] == ["e1", "e4", "e7"]
    grouped = [_ex(i, q=i, label=False, group="g" + str(i // 3)) for i in range(6)]
    assert {source_key(e) for e in grouped} == {"g0", "g1"}
    with pytest.raises(DataError, match="sum to 1"):
        split_examples(exs, fractions=(0.5, 0.5, 0.5))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 1)), min_size=4, max_size=60))
def test_response_metrics_match_sklearn(rows: list[tuple[bool, float]]) -> None:
    y = np.asarray([int(a) for a, _ in rows])
    s = np.asarray([b for _, b in rows])
    m = response_metrics(y, s, 0.5, n_boot=50)
    pred = s >= 0.5
    c = m["confusion"]
    assert c["tp"] == int((pred & (y == 1)).sum()) and c["tn"] == int((~pred & (y == 0)).sum())
    assert c["tp"] + c["fp"] + c["tn"] + c["fn"] == len(rows)
    if 0 < y.sum() < y.size:
        assert m["auroc"] == pytest.approx(roc_auc_score(y, s))
        assert m["ap"] == pytest.approx(average_precision_score(y, s))
        if m["auroc_ci"] is not None:
            assert m["auroc_ci"][0] <= m["auroc_ci"][1]
    else:
        assert m["auroc"] is None and m["ap"] is None


def test_bootstrap_ci_brackets_auroc_and_narrows_with_data() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    s = y * 0.3 + rng.random(400)
    wide = response_metrics(y[:40], s[:40], 0.5, n_boot=500)
    narrow = response_metrics(y, s, 0.5, n_boot=500)
    lo, hi = narrow["auroc_ci"]
    assert lo <= narrow["auroc"] <= hi
    assert (hi - lo) < (wide["auroc_ci"][1] - wide["auroc_ci"][0])


def test_best_threshold_maximises_f1() -> None:
    y = np.array([0, 0, 0, 1, 1, 1])
    s = np.array([0.1, 0.2, 0.35, 0.3, 0.8, 0.9])
    t = best_threshold(y, s)
    assert t == pytest.approx(0.3)  # catches all three positives with one false alarm
    assert best_threshold(np.zeros(3), s[:3]) == 0.5


def test_token_metrics_and_data_hash() -> None:
    m = token_metrics(np.array([0, 1, 0, 1]), np.array([0.1, 0.9, 0.2, 0.8]))
    assert m["ap"] == 1.0 and m["auroc"] == 1.0 and m["n_positive"] == 2
    exs = [_ex(i, q=i, label=bool(i % 2)) for i in range(6)]
    assert data_hash(exs) == data_hash(list(reversed(exs)))
    relabelled = [dataclasses.replace(exs[0], label=True, spans=()), *exs[1:]]
    assert data_hash(relabelled) != data_hash(exs)


def test_evaluate_end_to_end_on_tiny(tiny_model, tmp_path: Path) -> None:
    exs = [_ex(i, q=i, label=bool(i % 2)) for i in range(24)]
    splits = split_examples(exs, seed=0)
    run = evaluate(
        tiny_model,
        ["nll", "lexical"],
        Splits.of(splits, "toy"),
        EvalOptions(n_boot=100, save_artifacts=tmp_path / "art"),
    )
    assert [r.detector for r in run.results] == ["nll", "lexical"]
    assert run.split_sizes == {k: len(v) for k, v in splits.items()}
    for r in run.results:
        assert len(r.scores) == len(run.test_ids)
        assert (tmp_path / "art" / r.detector / "cfg.json").is_file()
    j, md = run.save(tmp_path / "runs")
    again = EvalRun.load(j)
    assert again.to_dict() == run.to_dict()
    assert "| nll |" in md.read_text() and "| lexical |" in md.read_text()
    # Loading the saved artifacts instead of training reproduces the scores.
    reloaded = evaluate(
        tiny_model,
        ["nll", "lexical"],
        Splits(train=[], validation=splits["validation"], test=splits["test"], train_dataset="toy"),
        EvalOptions(n_boot=0),
        artifacts={n: tmp_path / "art" / n for n in ("nll", "lexical")},
    )
    for a, b in zip(run.results, reloaded.results, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    # Detectors already loaded (`evaluate --as-trained` loads the set once) are not read
    # again: their folders are only recorded.
    held = {n: detector_class(n).load(tmp_path / "art" / n) for n in ("nll", "lexical")}
    gone = {n: tmp_path / "moved" / n for n in held}
    judged = Splits(
        train=[], validation=splits["validation"], test=splits["test"], train_dataset="toy"
    )
    again = evaluate(
        tiny_model,
        ["nll", "lexical"],
        judged,
        EvalOptions(n_boot=0),
        artifacts=gone,
        loaded=held,
    )
    assert [r.scores for r in again.results] == [r.scores for r in reloaded.results]
    assert [r.artifact for r in again.results] == [str(p) for p in gone.values()]
    with pytest.raises(DataError, match="without their artifact folder"):
        evaluate(tiny_model, ["nll"], judged, EvalOptions(n_boot=0), loaded=held)
    frame = run.to_frame()
    assert list(frame["detector"]) == ["nll", "lexical"]
    assert set(run.breakdown("generator")["generator"]) <= {"gen0", "gen1", "gen2"}


def test_evaluate_refuses_unlabelled_test_and_missing_training(tiny_model) -> None:
    exs = [_ex(i, q=i, label=bool(i % 2)) for i in range(6)]
    unl = [e.with_response(e.response) for e in exs[4:]]
    with pytest.raises(DataError, match="unlabelled"):
        evaluate(
            tiny_model,
            ["lexical"],
            Splits(train=exs[:4], validation=[], test=unl, train_dataset="t"),
            EvalOptions(n_boot=0),
        )
    with pytest.raises(DataError, match="no training examples"):
        evaluate(
            tiny_model,
            ["lexical"],
            Splits(train=[], validation=[], test=exs, train_dataset="t"),
            EvalOptions(n_boot=0),
        )


def test_saved_run_with_wrong_format_is_a_data_error(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{"format": 99}')
    with pytest.raises(DataError, match="format"):
        EvalRun.load(p)


def test_fit_gets_the_validation_split_and_never_the_test_split(
    tiny_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.detectors.baselines import NLLDetector

    seen: dict[str, list[str]] = {}

    class Selecting(NLLDetector):
        def fit(self, features, examples, *, validation=None):  # type: ignore[override]
            seen["train"] = [e.id for e in examples]
            seen["validation"] = [e.id for e in validation[1]] if validation else []
            assert validation is not None and len(validation[0]) == len(validation[1])
            return super().fit(features, examples)

    monkeypatch.setattr("core.evaluation.evaluate.make_detector", lambda name: Selecting())
    exs = [_ex(i, q=i, label=bool(i % 2)) for i in range(24)]
    splits = split_examples(exs, seed=0)
    evaluate(
        tiny_model,
        ["nll"],
        Splits.of(splits, "toy"),
        EvalOptions(n_boot=0),
    )
    assert seen["train"] == [e.id for e in splits["train"]]
    assert seen["validation"] == [e.id for e in splits["validation"]]
    assert not {e.id for e in splits["test"]} & {*seen["train"], *seen["validation"]}


def test_evaluate_reports_smoothed_token_metrics(tiny_model) -> None:
    exs = [_ex(i, q=i, label=bool(i % 2)) for i in range(24)]
    splits = split_examples(exs, seed=0)
    parts = Splits.of(splits, "toy")
    plain = evaluate(tiny_model, ["nll"], parts, EvalOptions(n_boot=0))
    assert "smoothed" not in plain.results[0].token_metrics
    assert "smoothed" not in plain.to_markdown()
    # p_stay 0.5 leaves the scores as they are; 0.99 spreads them along the answer.
    same = evaluate(tiny_model, ["nll"], parts, EvalOptions(n_boot=0, smooth=0.5))
    same = same.results[0].token_metrics
    assert same["smoothed"]["auroc"] == pytest.approx(same["auroc"], abs=1e-9)
    run = evaluate(tiny_model, ["nll"], parts, EvalOptions(n_boot=0, smooth=0.99))
    tok = run.results[0].token_metrics
    assert tok["smoothed"]["p_stay"] == 0.99
    assert tok["smoothed"]["auroc"] != pytest.approx(tok["auroc"], abs=1e-6)
    assert "token AUROC (smoothed 0.99)" in run.to_markdown()
    assert run.to_frame()["token AUROC smoothed"].iloc[0] == tok["smoothed"]["auroc"]


def test_token_threshold_is_the_best_token_f1_threshold():
    from core.base.examples import RAGExample, Span
    from core.evaluation.evaluate import token_labels_and_scores, token_threshold
    from core.learning.contract import Verdict
    from core.learning.metrics import best_threshold

    rng = np.random.default_rng(3)
    examples, verdicts = [], []
    for i in range(12):
        n = 10
        text = " ".join(f"w{j}" for j in range(n))
        offs = np.asarray([(3 * j, 3 * j + 2) for j in range(n)])
        hall = i % 3 != 0
        spans = (Span(start=6, end=14),) if hall else ()
        examples.append(
            RAGExample(
                id=f"e{i}", question="q", passages=("p",), response=text, label=hall, spans=spans
            )
        )
        scores = rng.random(n) * 0.6
        if hall:
            scores[2:5] += 0.3
        verdicts.append(
            Verdict(
                detector="d", example_id=f"e{i}", score=0.5, token_scores=scores, token_offsets=offs
            )
        )
    y, s = token_labels_and_scores(examples, verdicts)
    assert y.size == 120 and y.sum() == 8 * 3
    t = token_threshold(examples, verdicts)
    assert t == pytest.approx(best_threshold(y, s, "f1"))
    none = [Verdict(detector="d", example_id=e.id, score=0.5) for e in examples]
    assert token_threshold(examples, none) is None


def test_saved_runs_are_listed_by_the_stamp_their_name_starts_with(tmp_path: Path) -> None:
    """A fresh clone gives every run file one date: the stamp in the name orders them,
    newest first; a run named without one falls back on its file's time."""
    names = ["20261125-205830-cv5-a.json", "20261127-102453-cv5-b.json", "20261126-081005-c.json"]
    for n in names:
        (tmp_path / n).write_text("{}")
        os.utime(tmp_path / n, (1_000_000_000, 1_000_000_000))  # one date for all
    (tmp_path / "mine.json").write_text("{}")
    os.utime(tmp_path / "mine.json", (1_900_000_000, 1_900_000_000))  # 2030
    assert [p.name for p in list_runs(tmp_path)] == [
        "mine.json", "20261127-102453-cv5-b.json", "20261126-081005-c.json",
        "20261125-205830-cv5-a.json",
    ]  # fmt: skip
    assert list_runs(tmp_path / "none") == []


def _run_of(labels: list[int]) -> EvalRun:
    n = len(labels)
    return EvalRun(
        name="small",
        created_at="2026-11-27T00:00:00+00:00",
        model="m",
        train_dataset="demo",
        test_dataset="demo",
        data_hashes={},
        split_sizes={"train": 4, "validation": 1, "test": n},
        test_ids=tuple(f"t{i}" for i in range(n)),
        test_labels=tuple(labels),
        test_tasks=("qa",) * n,
        test_generators=("g",) * n,
        results=(),
    )


def test_a_report_on_too_few_answers_says_so_and_what_would_fix_it() -> None:
    """`evaluate --dataset demo --limit 6` tests on one answer: the report says the
    metrics are undefined or fixed by construction instead of printing zeros as facts;
    with fewer than MIN_CLASS_ANSWERS of a class it says how many more are needed."""
    assert "all faithful" in evidence_warning([0])
    assert "all hallucinated" in evidence_warning([1, 1, 1])
    assert "no labelled answer" in evidence_warning([])
    few = evidence_warning([1] * 3 + [0] * 30)
    assert "3 hallucinated and 30 faithful" in few
    assert f"{MIN_CLASS_ANSWERS - 3} more hallucinated answers needed" in few
    assert "(4 more answers of each class needed)" in evidence_warning([1] * 6 + [0] * 6)
    one_short = [1] * (MIN_CLASS_ANSWERS - 1) + [0] * 30
    assert "(1 more hallucinated answer needed)" in evidence_warning(one_short)  # not "answers"
    enough = [1] * MIN_CLASS_ANSWERS + [0] * MIN_CLASS_ANSWERS
    assert evidence_warning(enough) is None
    md = _run_of([0]).to_markdown()
    assert "**Too few answers.** The test answers hold 1 answer, all faithful" in md
    assert "Too few answers" not in _run_of(enough).to_markdown()
