"""Paired, source-grouped comparisons of detectors (core.learning.metrics.paired_difference,
core.evaluation.comparison) and how a cross-validation run stores and reads them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from core.base.errors import DataError
from core.data import load_builtin, stratified_head
from core.evaluation.comparison import checked_comparisons, compare_detectors, comparison_lines
from core.evaluation.crossval import CVOptions, cross_validate, default_maker
from core.evaluation.cv_run import CVRun
from core.learning.metrics import _auroc, paired_difference
from core.pipeline.extract import extract_features

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n_groups: int = 60, per: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_groups), per)
    y = rng.integers(0, 2, groups.size)
    return rng, y, groups


def test_rank_auroc_equals_sklearn_with_ties() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        y = rng.integers(0, 2, 50)
        y[:2] = [0, 1]
        s = rng.integers(0, 6, 50).astype(float)  # many ties
        assert _auroc(y == 1, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_identical_scores_differ_by_nothing() -> None:
    rng, y, g = _data()
    s = rng.normal(size=y.size)
    d = paired_difference(y, s, s.copy(), g, n_boot=200)
    assert d is not None
    assert d["delta"] == 0.0 and d["ci"] == [0.0, 0.0] and d["p"] == 1.0


def test_a_clearly_better_detector_is_significant_and_a_twin_is_not() -> None:
    rng, y, g = _data(n_groups=80)
    good = y + rng.normal(0, 0.6, y.size)
    weak = y + rng.normal(0, 3.0, y.size)
    twin = good + rng.normal(0, 0.05, y.size)
    d = paired_difference(y, good, weak, g, n_boot=400)
    assert d is not None
    assert d["delta"] == pytest.approx(roc_auc_score(y, good) - roc_auc_score(y, weak))
    assert 0 < d["ci"][0] <= d["delta"] <= d["ci"][1]
    assert d["p"] < 0.01
    t = paired_difference(y, twin, good, g, n_boot=400)
    assert t is not None and t["ci"][0] < 0 < t["ci"][1] and t["p"] > 0.05
    # Antisymmetric: b vs a is minus a vs b.
    back = paired_difference(y, weak, good, g, n_boot=400)
    assert back is not None and back["delta"] == pytest.approx(-d["delta"])


def test_the_pairing_narrows_the_interval_of_correlated_detectors() -> None:
    """Two detectors sharing most of their noise: the paired interval of their
    difference is much narrower than either marginal interval."""
    rng, y, g = _data(n_groups=80)
    shared = rng.normal(0, 1.5, y.size)
    a = y + shared
    b = y + shared + rng.normal(0, 0.3, y.size)
    d = paired_difference(y, a, b, g, n_boot=400)
    assert d is not None
    assert d["ci"][1] - d["ci"][0] < 0.08


def test_groups_are_resampled_whole() -> None:
    """Answers duplicated within their group: resampling groups keeps the interval
    honest (wide), resampling answers as if independent would shrink it."""
    rng = np.random.default_rng(3)
    base_y = rng.integers(0, 2, 40)
    base_a = base_y + rng.normal(0, 1.0, 40)
    base_b = base_y + rng.normal(0, 1.0, 40)
    y, a, b = (np.repeat(v, 10) for v in (base_y, base_a, base_b))
    by_group = paired_difference(y, a, b, np.repeat(np.arange(40), 10), n_boot=300)
    by_answer = paired_difference(y, a, b, np.arange(400), n_boot=300)
    assert by_group is not None and by_answer is not None
    width = lambda d: d["ci"][1] - d["ci"][0]  # noqa: E731
    assert width(by_group) > 2 * width(by_answer)


def test_one_class_or_mismatched_lengths() -> None:
    assert paired_difference(np.zeros(5), np.ones(5), np.ones(5), np.arange(5)) is None
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference(np.array([0, 1]), np.ones(2), np.ones(3), np.arange(2))


def test_compare_detectors_against_the_best_and_length() -> None:
    rng, y, g = _data()
    lengths = rng.normal(size=y.size) + 0.3 * y
    scores = {"weak": y + rng.normal(0, 3, y.size), "strong": y + rng.normal(0, 0.5, y.size)}
    c = compare_detectors(y, scores, g, lengths, n_boot=100)
    assert c["reference"] == "strong"
    assert c["rows"]["strong"]["vs_best"] is None
    assert c["rows"]["weak"]["vs_best"]["delta"] < 0
    assert c["rows"]["strong"]["vs_length"]["delta"] == pytest.approx(
        roc_auc_score(y, scores["strong"]) - roc_auc_score(y, lengths)
    )
    text = "\n".join(comparison_lines(c))
    assert "Δ AUROC vs strong" in text and "| weak |" in text and "| strong | - | - |" in text
    assert checked_comparisons(json.loads(json.dumps(c)), "r") == c


@pytest.mark.parametrize(
    "damage",
    [
        lambda c: c.update(reference=3),
        lambda c: c.update(rows=[]),
        lambda c: c["rows"]["weak"].update(vs_best={"delta": "0.1", "ci": [0, 1], "p": 0.5}),
        lambda c: c["rows"]["weak"].update(vs_best={"delta": 0.1, "ci": [0], "p": 0.5}),
        lambda c: c["rows"]["weak"].update(vs_length={"delta": float("nan"), "ci": [0, 1], "p": 1}),
        lambda c: c["rows"]["weak"].update(vs_length={"delta": 0.1, "ci": [True, 1], "p": 1}),
        lambda c: c["rows"].update(weak="x"),
    ],
)
def test_a_damaged_comparison_in_a_run_file_is_a_clear_error(damage) -> None:
    rng, y, g = _data()
    c = compare_detectors(
        y,
        {"weak": rng.normal(size=y.size), "strong": y * 1.0},
        g,
        rng.normal(size=y.size),
        n_boot=20,
    )
    c = json.loads(json.dumps(c))
    damage(c)
    with pytest.raises(DataError, match="run 'r7'.*paired comparisons are damaged"):
        checked_comparisons(c, "r7")


def test_a_cv_run_stores_its_comparisons_and_source_groups(tiny_model) -> None:
    exs = stratified_head(load_builtin(), 90)
    ext = extract_features(tiny_model, exs, [default_maker()(n) for n in ("nll", "lexical")])
    run = cross_validate(
        tiny_model, ["nll", "lexical"], exs, CVOptions(k=3, n_boot=50), extraction=ext
    )
    assert len(run.groups) == len(run.ids) and len(set(run.groups)) < len(run.ids)
    assert all(len(g) == 12 for g in run.groups)  # hashed, never the data's own names
    c = run.comparisons
    aucs = {r.detector: r.pooled["auroc"] for r in run.results}
    assert c["reference"] == max(aucs, key=aucs.get)
    other = next(n for n in aucs if n != c["reference"])
    assert c["rows"][other]["vs_best"]["delta"] == pytest.approx(aucs[other] - aucs[c["reference"]])
    assert "Paired differences" in run.to_markdown()
    back = CVRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back.groups == run.groups
    assert back.comparisons["rows"][other]["vs_best"]["ci"] == c["rows"][other]["vs_best"]["ci"]
    # A run saved before comparisons existed still loads, with none.
    old = run.to_dict()
    del old["groups"], old["comparisons"]
    legacy = CVRun.from_dict(json.loads(json.dumps(old)))
    assert legacy.comparisons == {} and "Paired differences" not in legacy.to_markdown()
    short = dict(run.to_dict(), groups=list(run.groups[:-1]))
    with pytest.raises(DataError, match="inconsistent"):
        CVRun.from_dict(json.loads(json.dumps(short)))
