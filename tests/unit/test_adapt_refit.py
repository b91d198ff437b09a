"""The adaptation's refit (issue 40): the ensemble gets a stacker of the dataset's own
fitted on every reviewed answer, its calibration fitted on that stacker's out-of-fold
scores of the random-order reviews, the derived set routes the dataset's answers through
it, adapting again without a refit drops it, the base set stays untouched, and a
tampered reviewed stacker is refused. A set of ``nll``, ``context_gain`` and an
ensemble of the two, trained on 60 built-in answers with the tiny model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.paths import adapted_sets_dir
from core.detectors.ensemble import POOLED_INPUT, EnsembleDetector
from core.engine.model import LoadedModel
from core.evaluation.adapt import (
    MIN_ADAPT_ANSWERS,
    REFIT_C,
    fit_refit,
    fit_review_calibration,
    fit_review_stacker,
)
from core.learning.artifact import artifact_hashes
from core.learning.calibration import logit
from core.pipeline.extract import FeatureCache, iter_features
from core.pipeline.judge import judge
from core.pipeline.sets import AdaptedInfo, load_set
from core.review import AnswerBook
from core.services.adapting import adapt_set
from core.services.jobs import AdaptSpec
from core.storage import Store

DATASET = "mine"
QUEUE = "stored:mine"
_ARRAYS = ("coef", "mean", "scale")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def ensemble_set(calibrated_tiny_ensemble_set: tuple[Path, Path]) -> tuple[Path, Path]:
    return calibrated_tiny_ensemble_set


@pytest.fixture
def env(
    ensemble_set: tuple[Path, Path], adapt_env: Callable[..., tuple[Store, list]]
) -> tuple[Store, list]:
    """The ensemble set as the app's detectors and the dataset ``mine`` (50 answers)."""
    return adapt_env(ensemble_set, 50)


def _ensemble(folder: Path, model: LoadedModel) -> EnsembleDetector:
    return EnsembleDetector.load(folder / "ensemble", model_key=model.info.key)


def _rows(model: LoadedModel, ens: EnsembleDetector, examples: list, store: Store) -> np.ndarray:
    """The review rows (members' logits, then the pooled stacker's) of ``examples``."""
    got = iter_features(model, examples, [ens], cache=FeatureCache(store))
    return np.stack([ens.review_row(g.features["ensemble"]) for g in got])


def _mark(store: Store, examples: list, labels: np.ndarray, drawn_by: str = "random") -> None:
    book = AnswerBook(store)
    for ex, lab in zip(examples, labels, strict=True):
        book.mark(QUEUE, ex, "ann", "hallucinated" if lab else "faithful", drawn_by=drawn_by)


def test_the_refit_routes_the_dataset_through_a_stacker_of_its_own(
    tiny_model: LoadedModel,
    env: tuple[Store, list],
    ensemble_set: tuple[Path, Path],
    tree_digest: Callable[[Path], str],
) -> None:
    store, examples = env
    before = tree_digest(ensemble_set[0])
    base = _ensemble(ensemble_set[0], tiny_model)
    reviewed = examples[:40]
    rows = _rows(tiny_model, base, reviewed, store)
    # The reviewers judge by what nll reads (the tiny model's gold labels are noise to
    # it): a stacker over the members ranks their labels better than the pooled one.
    y = rows[:, 0] > np.median(rows[:, 0])
    _mark(store, reviewed[:30], y[:30])
    _mark(store, reviewed[30:], y[30:], drawn_by="uncertainty")  # these fit the stacker too
    key = tiny_model.info.key
    result = adapt_set(
        store, tiny_model, load_set(key), QUEUE, examples, adapted_sets_dir(key), refit=True
    )
    assert tree_digest(ensemble_set[0]) == before  # the base set is untouched
    assert result.record.refitted and "fitted on 40 reviewed answers" in result.record.refit
    assert AdaptedInfo.read(result.folder).refit
    cfg = json.loads((result.folder / "ensemble" / "cfg.json").read_text())
    assert cfg["config"]["dataset_stackers"] == {DATASET: []}
    assert cfg["adapted"]["refitted"] and cfg["metrics"]  # the rest of cfg.json is kept

    # the stacker is the one fit_refit gives on the 40 reviewed answers' rows, and the
    # calibration is fitted on its out-of-fold scores of the 30 random ones
    refit = fit_refit(rows, y, base=rows[:, -1])
    assert refit.stacker is not None and refit.out_of_fold is not None
    adapted = _ensemble(result.folder, tiny_model)
    own = adapted.dataset_stackers_[DATASET]
    assert own.reviewed and own.stacker.C == REFIT_C
    np.testing.assert_allclose(own.stacker.coef_, refit.stacker.coef_)
    assert adapted.input_names(DATASET) == ["nll", "context_gain", POOLED_INPUT]
    is_random = np.arange(40) < 30
    cal = fit_review_calibration(refit.out_of_fold[is_random], y[is_random])
    mine = adapted.dataset_calibration_[DATASET]
    assert mine.calibrator.a_ == pytest.approx(cal.calibrator.a_)
    assert mine.calibrator.b_ == pytest.approx(cal.calibrator.b_)
    assert mine.threshold == pytest.approx(y[is_random].mean())

    # an answer not reviewed: judged by the derived set through the dataset's stacker
    routed = load_set(key)
    assert DATASET in routed.experts, routed.expert_problems
    v = judge(tiny_model, examples[45], routed)
    assert v.set_name == result.folder.name
    ens = v.verdicts["ensemble"]
    assert ens.calibrated_for == DATASET and DATASET in ens.raw_by_dataset
    row = base.review_row(
        next(iter(iter_features(tiny_model, [examples[45]], [base]))).features["ensemble"]
    )
    raw = float(refit.stacker.predict_proba(row[None, :])[0])
    assert ens.raw_by_dataset[DATASET] == pytest.approx(raw)
    assert ens.score == pytest.approx(cal.apply(raw))
    assert row[-1] == pytest.approx(float(logit(np.asarray([ens.raw_score]))[0]), abs=1e-6)

    # adapting again without a refit drops the reviewed stacker
    again = adapt_set(store, tiny_model, load_set(key), QUEUE, examples, adapted_sets_dir(key))
    assert again.folder == result.folder and not again.record.refitted
    assert not AdaptedInfo.read(again.folder).refit
    plain = _ensemble(again.folder, tiny_model)
    assert DATASET not in plain.dataset_stackers_ and DATASET not in plain.config.dataset_stackers
    assert DATASET in plain.dataset_calibration_  # still calibrated for the dataset
    assert tree_digest(ensemble_set[0]) == before


def test_a_refit_that_ranks_no_better_than_the_base_is_not_kept(
    tiny_model: LoadedModel, env: tuple[Store, list], ensemble_set: tuple[Path, Path]
) -> None:
    store, examples = env
    rows = _rows(tiny_model, _ensemble(ensemble_set[0], tiny_model), examples[:30], store)
    _mark(store, examples[:30], rows[:, -1] > np.median(rows[:, -1]))  # the base ranks all
    key = tiny_model.info.key
    result = adapt_set(
        store, tiny_model, load_set(key), QUEUE, examples, adapted_sets_dir(key), refit=True
    )
    assert not result.record.refitted and not AdaptedInfo.read(result.folder).refit
    assert result.record.refit.startswith("no refit: on the 30 reviewed answers")
    assert "does not beat the base reading's (1.000)" in result.summary()["refit"]
    assert DATASET not in _ensemble(result.folder, tiny_model).dataset_stackers_


def test_a_tampered_reviewed_stacker_is_refused(
    tiny_model: LoadedModel,
    env: tuple[Store, list],
    tmp_path: Path,
    ensemble_set: tuple[Path, Path],
) -> None:
    store, examples = env
    rows = _rows(tiny_model, _ensemble(ensemble_set[0], tiny_model), examples[:30], store)
    _mark(store, examples[:30], rows[:, 0] > np.median(rows[:, 0]))
    key = tiny_model.info.key
    result = adapt_set(
        store, tiny_model, load_set(key), QUEUE, examples, adapted_sets_dir(key), refit=True
    )
    for edit in (
        lambda w: w["dataset_stackers"][DATASET].update(reviewed="yes"),
        lambda w: [w["dataset_stackers"][DATASET]["response"][k].pop() for k in _ARRAYS],
        # each fitted number is checked like the pooled stacker's (issue 52)
        lambda w: w["dataset_stackers"][DATASET]["response"]["coef"].__setitem__(0, float("nan")),
        lambda w: w["dataset_stackers"][DATASET]["response"].update(intercept=float("inf")),
        lambda w: w["dataset_stackers"][DATASET]["response"].update(
            scale=[0.0] * len(w["dataset_stackers"][DATASET]["response"]["scale"])
        ),
        lambda w: w["dataset_stackers"][DATASET].update(answer_token_members=["nll"]),
    ):
        folder = tmp_path / f"t{id(edit)}"
        folder.mkdir()
        shutil.copytree(result.folder / "ensemble", folder / "ensemble")
        weights = folder / "ensemble" / "weights.json"
        w = json.loads(weights.read_text())
        edit(w)
        weights.write_text(json.dumps(w))
        cfg_path = folder / "ensemble" / "cfg.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["files"] = artifact_hashes(folder / "ensemble")  # re-hashed: only the checks stand
        cfg_path.write_text(json.dumps(cfg))
        with pytest.raises(DataError, match="stacker"):
            _ensemble(folder, tiny_model)


def test_a_reviewed_stacker_must_read_the_review_rows(
    tiny_model: LoadedModel, ensemble_set: tuple[Path, Path]
) -> None:
    ens = _ensemble(ensemble_set[0], tiny_model)
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2 == 0
    wrong = fit_review_stacker(rng.normal(size=(40, 5)), y)
    with pytest.raises(DataError, match="inputs"):
        ens.with_review_stacker(DATASET, wrong)
    right = fit_review_stacker(rng.normal(size=(40, 3)), y)
    copy = ens.with_review_stacker(DATASET, right)
    assert DATASET in copy.dataset_stackers_ and DATASET not in ens.dataset_stackers_
    assert ens.with_review_stacker(DATASET, None).dataset_stackers_ == {}


def test_fit_refit_needs_enough_of_each_class_and_scores_out_of_fold() -> None:
    rng = np.random.default_rng(1)
    short = fit_refit(rng.normal(size=(10, 3)), np.arange(10) % 2 == 0, base=np.zeros(10))
    assert short.stacker is None and f"at least {MIN_ADAPT_ANSWERS}" in str(short.reason)
    one_side = fit_refit(rng.normal(size=(40, 3)), np.arange(40) < 3, base=np.zeros(40))
    assert one_side.stacker is None and "3 hallucinated" in str(one_side.reason)
    y = rng.random(60) < 0.4
    x = np.column_stack([y + rng.normal(0, 1, 60), rng.normal(size=60)])
    got = fit_refit(x, y, base=rng.normal(size=60))  # a base that ranks by chance
    assert got.stacker is not None and got.out_of_fold is not None
    # out of fold: no row is scored by a stacker that saw it (differs from in-sample)
    assert not np.allclose(got.out_of_fold, got.stacker.predict_proba(x))
    assert got.n == 60 and got.n_positive == int(y.sum())
    assert got.auroc > got.base_auroc
    # a base that already ranks the reviewed answers better keeps no stacker, and says so
    better = fit_refit(x, y, base=y + rng.normal(0, 0.1, 60))
    assert better.stacker is None and better.auroc <= better.base_auroc
    assert "does not beat the base reading" in str(better.reason)


def test_the_job_spec_carries_the_refit() -> None:
    spec = AdaptSpec(model="tiny", dataset=QUEUE, queue=QUEUE, refit=True)
    assert spec.argv("out")[-1] == "--refit"
    assert AdaptSpec.from_dict(spec.to_dict()) == spec
    old = {k: v for k, v in spec.to_dict().items() if k != "refit"}
    assert AdaptSpec.from_dict(old).refit is False  # a row written before the refit
    with pytest.raises(DataError, match="true or false"):
        AdaptSpec.from_dict({**spec.to_dict(), "refit": "yes"})
