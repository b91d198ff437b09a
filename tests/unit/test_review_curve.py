"""Learning curves of the review loop on synthetic out-of-fold scores: calibration from
random reviews fixes a miscalibrated base, the uncertainty order never calibrates past
its first random batch, the refit learns from the members, the references, and a saved
run read back as untrusted; plus the shipped default set's recorded runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.paths import shipped_runs_dir
from core.cli import main
from core.evaluation.review_curve import (
    FIRST_BATCH,
    CurveData,
    CurveRun,
    curve_data,
    learning_curve,
    own_cv,
    review_curve,
    set_curve_data,
)


def _data(n: int = 300, seed: int = 0) -> CurveData:
    """Answers whose raw score is informative, read by a base that says every answer is
    twice as likely hallucinated as it is (a miscalibrated pooled calibration), and a
    member that holds extra signal."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.3
    raw = 1 / (1 + np.exp(-(np.where(y, 1.0, -1.0) + rng.normal(0, 1.2, n))))
    member = 1 / (1 + np.exp(-(np.where(y, 1.5, -1.5) + rng.normal(0, 1.0, n))))
    prob = np.clip(raw * 1.6, 0, 1)
    return CurveData(
        dataset="synthetic",
        judge="ensemble",
        ids=tuple(f"a{i}" for i in range(n)),
        y=y,
        raw=raw,
        prob=prob,
        flagged=prob >= 0.5,
        members={"member": member},
        runs=("run",),
    )


def test_random_reviews_calibrate_and_the_uncertainty_order_does_not() -> None:
    data = _data()
    points = {(p.order, p.n): p for p in learning_curve(data, sizes=(10, 50, 100), seeds=8)}
    r100 = points["random", 100]
    assert r100.calibrated_share == 1.0 and points["random", 10].calibrated_share == 0.0
    assert r100.adapted["ece"][0] < r100.unadapted["ece"][0] - 0.1
    assert r100.adapted["balanced_accuracy"][0] > r100.unadapted["balanced_accuracy"][0]
    lo, mean, hi = r100.adapted["ece"][1], r100.adapted["ece"][0], r100.adapted["ece"][2]
    assert lo <= mean <= hi
    # only the first batch of the uncertainty order is random: below the minimum
    assert FIRST_BATCH < 20 and points["uncertainty", 100].calibrated_share == 0.0
    # the refit over the judge and a better member beats the judge alone
    assert r100.adapted["refit_auroc"][0] > r100.adapted["auroc"][0]
    # the refit is calibrated by the random reviews (on its out-of-fold scores): never in
    # the uncertainty order, whose random batch is too small
    assert r100.adapted["refit_ece"][0] < r100.unadapted["ece"][0] - 0.1
    assert r100.adapted["refit_balanced_accuracy"][0] > r100.unadapted["balanced_accuracy"][0]
    assert math.isnan(points["uncertainty", 100].adapted["refit_ece"][0])
    assert math.isfinite(points["uncertainty", 100].adapted["refit_auroc"][0])
    own = own_cv(data)
    assert own["ece"] < 0.1 and own["refit_auroc"] > own["auroc"]
    assert own["refit_ece"] < 0.1


def test_a_saved_curve_reads_back_and_a_hostile_one_is_refused(tmp_path: Path) -> None:
    run = review_curve(_data(), set_name="default", sizes=(50,), seeds=3)
    j, m = run.save(tmp_path)
    back = CurveRun.load(j)
    assert back.point("random", 50) == run.point("random", 50)
    assert back.own_cv == pytest.approx(run.own_cv)
    assert "| random | 50 |" in m.read_text()
    d = json.loads(j.read_text())
    for bad in (
        {**d, "kind": "cv"},
        {**d, "points": [{"order": "random"}]},
        {**d, "n_answers": "x"},
    ):
        with pytest.raises(DataError):
            CurveRun.from_dict(bad)


def test_curve_data_reads_a_cv_run_and_names_what_is_missing() -> None:
    run = {
        "name": "r",
        "ids": ["a", "b", "c"],
        "labels": [1, 0, 1],
        "example_datasets": ["x", "x", "y"],
        "results": [
            {
                "detector": "ensemble",
                "scores": [0.9, 0.2, 0.5],
                "raw_scores": [0.8, 0.1, 0.5],
                "flagged": [True, False, True],
            }
        ],
    }
    data = curve_data(run, "x", "ensemble")
    assert data.ids == ("a", "b") and list(data.y) == [True, False]
    assert data.threshold == pytest.approx(0.9)
    with pytest.raises(DataError, match="no answers of 'z'"):
        curve_data(run, "z", "ensemble")
    with pytest.raises(DataError, match="no nll results"):
        curve_data(run, "x", "nll")
    with pytest.raises(DataError, match="one per answer"):
        curve_data({**run, "results": [{**run["results"][0], "scores": [0.1]}]}, "x", "ensemble")


def test_the_default_sets_recorded_runs_draw_dollys_curve(tmp_path: Path) -> None:
    folder = Path(__file__).resolve().parents[2] / "assets" / "detectors"
    data = set_curve_data(folder, "dolly_ac_dev", [shipped_runs_dir()])
    assert data.y.size == 138 and len(data.members) >= 10
    run = review_curve(data, set_name="default", sizes=(50,), seeds=2)
    p = run.point("random", 50)
    assert p is not None and p.calibrated_share == 1.0 and math.isfinite(p.adapted["ece"][0])
    # the CLI saves the same kind of run
    assert (
        main(
            [
                "evaluate",
                "--review-curve",
                "shared:dolly_ac_dev",
                "--seeds",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (saved,) = tmp_path.glob("*review-curve-dolly_ac_dev.json")
    assert CurveRun.load(saved).set_name == "default"
