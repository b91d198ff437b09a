"""Cross-validation: detection numbers that can be trusted.

- :func:`make_folds`: grouped K folds. A source (question + passages, or the dataset's
  own group) never spans folds, so answers of six generators to one question are tested
  together; folds are stratified by label x generator x dataset.
- :func:`fit_procedure` is THE recipe, used alike inside every fold, for the shipped
  artifacts and for the matrix: the training answers are split again (grouped,
  stratified) into a fitting part and a validation part (``val_share`` of the sources);
  the detector learns on the first (selecting hyper-parameters on the second when it
  does so); a Platt calibrator, the answer threshold and the token threshold are then
  fitted on cross-fitted scores of all the training answers (each scored by a detector
  fitted the same way without it; ``calibration="split"``: on the validation part
  only), optionally only on the datasets given as ``calibrate_on``. Nothing of the test
  fold reaches it.
- :func:`cross_validate` scores every answer out of fold exactly once and pools: AUROC
  and AP with source-grouped bootstrap CIs, balanced accuracy / F1 at each fold's own
  threshold, expected calibration error and the reliability diagram of the calibrated
  scores, token AP / AUROC, the per-fold spread, and breakdowns by generator and dataset.

Runs save as JSON (+ markdown) and load back (:class:`CVRun`); the cross-domain
matrix built on these pieces is :mod:`core.evaluation.matrix`; the Benchmark page shows both.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample, source_key
from core.data import data_hash
from core.detectors import make_detector
from core.engine.model import LoadedModel
from core.evaluation.comparison import compare_detectors
from core.evaluation.cv_run import (
    CALIBRATIONS,
    LENGTH_BINS,
    Calibration,
    Criterion,
    CVResult,
    CVRun,
)
from core.evaluation.evaluate import (
    file_stem,
    fit_detector,
    set_thresholds,
    token_labels_and_scores,
)
from core.evaluation.foldstore import FoldResult, fold_key, fold_result, load_fold, save_fold
from core.evaluation.span_choice import choose_span_rule
from core.learning.calibration import reliability
from core.learning.contract import Detector, Features, Verdict, for_dataset
from core.learning.metrics import (
    auroc_or_none,
    grouped_bootstrap_ci,
    is_binary,
    length_bins,
    matched_auroc,
    response_metrics,
    span_overlap_metrics,
    token_metrics,
)
from core.pipeline.extract import Extraction, FeatureCache, extract_features
from core.pipeline.word_spans import detector_spans

CROSSFIT_K = 5
"""Inner folds of cross-fitted calibration."""
CROSSFIT_MIN_SOURCES = 7
"""Fewest training sources cross-fitting works on: each of its :data:`CROSSFIT_K`
training parts must still split into fitting and validation parts."""
MakeDetector = Callable[[str], Detector]
VAL_SHARE = 0.2
"""Share of the training sources held out inside each fit for selection and calibration."""


# ----------------------------------------------------------------------------- folds


def strata(examples: Sequence[RAGExample]) -> np.ndarray:
    """One stratum per example: label x generator x dataset."""
    return np.asarray(
        [
            f"{int(bool(e.label))}|{e.provenance.generator or ''}|{e.provenance.dataset or ''}"
            for e in examples
        ]
    )


def _grouped_folds(
    examples: Sequence[RAGExample], k: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedGroupKFold

    groups = np.asarray([source_key(e) for e in examples])
    n_groups = len(set(groups.tolist()))
    if n_groups < k:
        raise DataError(
            f"{k} folds need at least {k} sources (questions with their passages); these "
            f"examples have {n_groups}. Use fewer folds or more data"
        )
    _, codes = np.unique(strata(examples), return_inverse=True)
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        # Rare strata (one generator's few hallucinations) are spread as well as they can be.
        warnings.simplefilter("ignore", UserWarning)
        try:
            return list(cv.split(np.zeros(len(examples)), codes, groups))
        except ValueError as e:
            raise DataError(
                f"cannot split {len(examples)} answers from {n_groups} sources into {k} parts "
                f"({e}); use fewer folds, a larger validation share or more data"
            ) from e


def make_folds(examples: Sequence[RAGExample], k: int = 5, seed: int = 0) -> np.ndarray:
    """``[n]`` fold index of every example (see the module docstring).

    Raises:
        DataError: Fewer sources than folds, or fewer than 2 folds.
    """
    if k < 2:
        raise DataError(f"cross-validation needs at least 2 folds, got {k}")
    fold = np.full(len(examples), -1, dtype=np.int64)
    for i, (_, test) in enumerate(_grouped_folds(examples, k, seed)):
        fold[test] = i
    return fold


def inner_split(
    examples: Sequence[RAGExample], share: float = VAL_SHARE, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a fitting part and a validation part (about ``share`` of the sources),
    grouped and stratified like the folds."""
    k = max(2, round(1.0 / share))
    fit, val = _grouped_folds(examples, k, seed)[0]
    return np.sort(fit), np.sort(val)


# ----------------------------------------------------------------------------- the recipe


def fit_procedure(
    make: MakeDetector,
    name: str,
    features: Sequence[Features],
    examples: Sequence[RAGExample],
    *,
    criterion: Criterion = "balanced_accuracy",
    calibrate_on: Sequence[str] | None = None,
    val_share: float = VAL_SHARE,
    seed: int = 0,
    calibration: Calibration = "crossfit",
) -> Detector:
    """A fitted, calibrated, thresholded detector from training answers only.

    Args:
        make: Builds a fresh detector by name.
        name: The detector.
        features, examples: The training answers (aligned).
        criterion: What the answer threshold maximises on the validation part.
        calibrate_on: Dataset names (``provenance.dataset``) whose validation answers
            fit the calibrator and threshold (default: all of them).
        val_share: Share of the sources held out as the validation part.
        seed: Seed of the inner split.
        calibration: ``"crossfit"`` (default): the calibrator and thresholds are fitted
            on cross-fitted scores of *every* training answer — :data:`CROSSFIT_K` inner
            grouped folds, each scored by a detector fitted (by the same split recipe,
            with what the kept detector chose pinned: :meth:`Detector.pinned`) without
            it — five times the answers of the validation part alone, so fewer noisy
            calibrators and thresholds; ``"split"``: on the validation part only
            (the detector's own scores; what artifacts trained before it used).

    Raises:
        DataError: A part without both classes, or no validation answer of
            ``calibrate_on``.
    """
    det, n_fit, n_val = _fit_on_split(make, name, features, examples, val_share, seed)
    raw: list[Verdict] | None = None
    if calibration == "crossfit":
        cal_f, cal_e = list(features), list(examples)
        raw = _crossfit_verdicts(
            pinned_maker(make, det.pinned()), name, features, examples, val_share, seed
        )
    elif calibration == "split":
        _, val_i = inner_split(examples, val_share, seed)
        cal_f, cal_e = [features[i] for i in val_i], [examples[i] for i in val_i]
    else:
        raise DataError(f"unknown calibration {calibration!r}; use one of {list(CALIBRATIONS)}")
    use = [True] * len(cal_e)
    if calibrate_on is not None:
        wanted = set(calibrate_on)
        use = [e.provenance.dataset in wanted for e in cal_e]
        if not any(use):
            raise DataError(
                f"no validation answers from {sorted(wanted)} to calibrate on; include those "
                "datasets in the training data"
            )
    set_thresholds(
        det, cal_f, cal_e, criterion=criterion, calibrate=use, raw_verdicts=raw, by_dataset=True
    )
    det.train_info_ = {
        **det.train_info_,
        "procedure": {
            "n_fit": n_fit,
            "n_validation": n_val,
            "n_calibration": int(sum(use)),
            "calibration": calibration,
            "calibrate_on": sorted(set(calibrate_on)) if calibrate_on is not None else None,
            "criterion": criterion,
            "val_share": val_share,
            "seed": seed,
        },
    }
    return det


def _fit_on_split(
    make: MakeDetector,
    name: str,
    features: Sequence[Features],
    examples: Sequence[RAGExample],
    val_share: float,
    seed: int,
) -> tuple[Detector, int, int]:
    """A fresh detector fitted on the fitting part of :func:`inner_split`, selecting on
    its validation part (uncalibrated, threshold not yet set), and the two parts' sizes."""
    fit_i, val_i = inner_split(examples, val_share, seed)
    det = make(name)
    fit_detector(
        det,
        [features[i] for i in fit_i],
        [examples[i] for i in fit_i],
        ([features[i] for i in val_i], [examples[i] for i in val_i]),
    )
    return det, int(fit_i.size), int(val_i.size)


def _crossfit_verdicts(
    make: MakeDetector,
    name: str,
    features: Sequence[Features],
    examples: Sequence[RAGExample],
    val_share: float,
    seed: int,
) -> list[Verdict]:
    """Uncalibrated verdicts on every answer, each from a detector fitted (by
    :func:`_fit_on_split`) on the other inner folds' answers only."""
    n_sources = len({source_key(e) for e in examples})
    if n_sources < CROSSFIT_MIN_SOURCES:
        raise DataError(
            f"cross-fitted calibration needs at least {CROSSFIT_MIN_SOURCES} sources (questions "
            f"with their passages) to train on; these answers have {n_sources}. Use "
            "calibration on the validation part (`--calibration split`) or more data"
        )
    out: list[Verdict | None] = [None] * len(examples)
    try:
        for tr, te in _grouped_folds(examples, CROSSFIT_K, seed + 7919):
            det, _, _ = _fit_on_split(
                make, name, [features[i] for i in tr], [examples[i] for i in tr], val_share, seed
            )
            det.calibration_ = None
            for i in te:
                out[i] = det.predict(features[i])
    except DataError as e:
        raise DataError(
            f"cross-fitted calibration of {name}: {e}; or calibrate on the validation part "
            "(`--calibration split`)"
        ) from e
    missing = [examples[i].id for i, v in enumerate(out) if v is None]
    if missing:
        raise DataError(
            f"cross-fitting left {len(missing)} answers unscored (first {missing[0]!r})"
        )
    return [v for v in out if v is not None]


def pinned_maker(make: MakeDetector, pins: Mapping[str, Any]) -> MakeDetector:
    """``make`` with ``pins`` (:meth:`~core.learning.contract.Detector.pinned`) overriding the
    config of every detector it builds."""
    if not pins:
        return make

    def pinned(name: str) -> Detector:
        det = make(name)
        return type(det)(replace(det.config, **pins))  # type: ignore[call-arg]  # Detector is a protocol; every detector class takes its config

    return pinned


def default_maker(configs: Mapping[str, Mapping[str, Any]] | None = None) -> MakeDetector:
    """``name -> make_detector(name, **configs[name])``."""
    cfg = dict(configs or {})

    def make(name: str) -> Detector:
        return make_detector(name, **dict(cfg.get(name, {})))

    return make


# ----------------------------------------------------------------------------- results


# ----------------------------------------------------------------------------- metrics


def ids_hash(examples: Sequence[RAGExample]) -> str:
    """A hash of the answers' ids in order (what a checkpoint's answers are)."""
    return hashlib.sha256("\n".join(e.id for e in examples).encode()).hexdigest()


def answer_lengths(examples: Sequence[RAGExample]) -> np.ndarray:
    """Each answer's length in words: the trivial baseline every detector must beat."""
    return np.asarray([len(e.response.split()) for e in examples], dtype=np.float64)


def pooled_metrics(
    y: np.ndarray,
    scores: np.ndarray,
    flagged: np.ndarray,
    groups: np.ndarray,
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """Metrics of out-of-fold scores with each fold's own decisions (``flagged``)."""
    m = response_metrics(y, flagged.astype(float), 0.5, n_boot=0)  # decisions at 0/1
    out: dict[str, Any] = {
        k: m[k]
        for k in ("n", "n_positive", "balanced_accuracy", "f1", "precision", "recall", "confusion")
    }
    ranked = response_metrics(y, scores, 0.5, n_boot=0)
    out["auroc"], out["ap"] = ranked["auroc"], ranked["ap"]
    out["auroc_ci"] = grouped_bootstrap_ci(y, scores, groups, "auroc", n_boot=n_boot, seed=seed)
    out["ap_ci"] = grouped_bootstrap_ci(y, scores, groups, "ap", n_boot=n_boot, seed=seed)
    out["ece"] = reliability(y, scores).ece if y.size else None
    return out


def _breakdown(
    keys: np.ndarray,
    y: np.ndarray,
    scores: np.ndarray,
    flagged: np.ndarray,
    groups: np.ndarray | None = None,
    n_boot: int = 0,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per value of ``keys``: n, positives, AUROC, balanced accuracy, ECE; with ``groups``
    and ``n_boot``, also ``auroc_ci``, the AUROC's source-grouped bootstrap 95% interval
    over that part's answers alone (``None`` where it cannot be had)."""
    from sklearn.metrics import balanced_accuracy_score

    out: dict[str, dict[str, Any]] = {}
    for k in sorted(set(keys.tolist())):
        mask = keys == k
        yk = y[mask]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ba = float(balanced_accuracy_score(yk, flagged[mask])) if is_binary(yk) else None
        out[str(k)] = {
            "n": int(mask.sum()),
            "n_positive": int(yk.sum()),
            "auroc": auroc_or_none(yk, scores[mask]),
            "balanced_accuracy": ba,
            "ece": reliability(yk, scores[mask]).ece,
        }
        if groups is not None and n_boot > 0:
            out[str(k)]["auroc_ci"] = (
                grouped_bootstrap_ci(yk, scores[mask], groups[mask], n_boot=n_boot, seed=seed)
                if is_binary(yk)
                else None
            )
    return out


def _with_own(
    pooled: dict[str, dict[str, Any]], own: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The per-dataset breakdown, with ``own_auroc`` (and ``own_auroc_ci`` when ``own``
    has it), ``own_balanced_accuracy`` and ``own_ece`` from each dataset's own
    calibration (and the ensemble's stacker of that dataset's own, where it has one:
    then the AUROC differs too) beside the pooled ones."""
    return {
        k: {
            **v,
            "own_auroc": own[k]["auroc"],
            **({"own_auroc_ci": own[k]["auroc_ci"]} if "auroc_ci" in own[k] else {}),
            "own_balanced_accuracy": own[k]["balanced_accuracy"],
            "own_ece": own[k]["ece"],
        }
        for k, v in pooled.items()
    }


def _with_tokens(
    by_set: dict[str, dict[str, Any]],
    sets: np.ndarray,
    examples: Sequence[RAGExample],
    verdicts: Sequence[Verdict | None],
    thresholds: Sequence[float | None],
) -> dict[str, dict[str, Any]]:
    """The per-dataset breakdown, with ``token_ap`` and ``token_auroc`` over each
    dataset's labelled tokens and ``spans``, the span precision / recall / F1 of
    :func:`span_metrics` over the dataset's answers (each ``None`` where it has no
    token labels or scores)."""
    out = {}
    for k, v in by_set.items():
        idx = [i for i in np.flatnonzero(sets == k).tolist() if verdicts[i] is not None]
        part = [examples[i] for i in idx]
        judged = [cast(Verdict, verdicts[i]) for i in idx]
        ty, ts = token_labels_and_scores(part, judged)
        t = token_metrics(ty, ts) if ty.size else {}
        out[k] = {
            **v,
            "token_ap": t.get("ap"),
            "token_auroc": t.get("auroc"),
            "spans": span_metrics(part, judged, [thresholds[i] for i in idx]),
        }
    return out


def span_metrics(
    examples: Sequence[RAGExample],
    verdicts: Sequence[Verdict | None],
    thresholds: Sequence[float | None],
) -> dict[str, Any] | None:
    """Span precision / recall / F1 by character overlap of each answer's whole-word
    spans at its own token threshold (``thresholds[i]``: that of the fold that judged
    it), over the answers with gold spans and the faithful ones (hallucinated answers
    without span labels are left out, as :func:`token_labels_and_scores` leaves them);
    ``None`` when no answer has token scores, a token threshold and gold to compare."""
    pred: list[list[tuple[int, int]]] = []
    gold: list[list[tuple[int, int]]] = []
    for e, v, t in zip(examples, verdicts, thresholds, strict=True):
        if v is None or v.token_scores is None or t is None:
            continue
        if not e.spans and e.label is not False:
            continue
        pred.append([(a, b) for a, b, _ in detector_spans(e.response, v, t)])
        gold.append([(g.start, g.end) for g in e.spans])
    m = span_overlap_metrics(pred, gold)
    return m if m["f1"] is not None else None


# ----------------------------------------------------------------------------- CV


def label_array(examples: Sequence[RAGExample]) -> np.ndarray:
    missing = [e.id for e in examples if e.label is None]
    if missing:
        raise DataError(
            f"cross-validation needs labelled answers; {len(missing)} have no label (first: "
            f"{missing[0]!r})"
        )
    return np.asarray([int(bool(e.label)) for e in examples])


def extract_all(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[str],
    make: MakeDetector,
    *,
    cache: FeatureCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Extraction:
    """Features of every example for every detector (cached, failed examples skipped)."""
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise DataError("example ids repeat; ids must be unique across the datasets combined")
    return extract_features(
        model,
        examples,
        [make(n) for n in detectors],
        cache=cache,
        progress=progress,
        on_error="skip",
    )


@dataclass(frozen=True, kw_only=True)
class CVOptions:
    """How a cross-validation runs. Every field but ``name`` and ``checkpoint`` keys
    the fold checkpoints, so a changed option refits instead of reading a stale fold.

    Attributes:
        k: Folds.
        seed: Seed of the folds and inner splits.
        criterion: What each fold's threshold maximises on its validation part.
        calibrate_on: Datasets whose validation answers calibrate (default: all).
        calibration: How each fold's calibrator is fitted (:func:`fit_procedure`).
        val_share: Share of each training part held out for selection/calibration.
        n_boot: Grouped bootstrap resamples for the CIs.
        name: Run name (default: the time, ``cv{k}`` and the datasets).
        checkpoint: A folder of fold checkpoints (:mod:`core.evaluation.foldstore`):
            each fold is saved there once scored, and a fold already saved by the same
            run (same detector config, data, folds, options and code) is read instead
            of refitted.
    """

    k: int = 5
    seed: int = 0
    criterion: Criterion = "balanced_accuracy"
    calibrate_on: Sequence[str] | None = None
    calibration: Calibration = "crossfit"
    val_share: float = VAL_SHARE
    n_boot: int = 1000
    name: str | None = None
    checkpoint: str | Path | None = None

    def fold_parts(self) -> dict[str, Any]:
        """What of these options keys a fold checkpoint."""
        return {
            "k": self.k,
            "seed": self.seed,
            "criterion": self.criterion,
            "calibrate_on": sorted(self.calibrate_on) if self.calibrate_on is not None else None,
            "calibration": self.calibration,
            "val_share": self.val_share,
        }

    def fit(
        self,
        make: MakeDetector,
        name: str,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        seed: int,
    ) -> Detector:
        """:func:`fit_procedure` with these options (and ``seed``)."""
        return fit_procedure(
            make,
            name,
            features,
            examples,
            criterion=self.criterion,
            calibrate_on=self.calibrate_on,
            calibration=self.calibration,
            val_share=self.val_share,
            seed=seed,
        )


@dataclass(frozen=True)
class CVProgress:
    """What a cross-validation reports as it goes (each optional).

    Attributes:
        extraction: ``(done, total)`` of the feature extraction.
        fold: ``(detector, fold, k)`` before each fold's fit.
        resumed: ``(detector, fold, k)`` for each fold read from the checkpoint.
    """

    extraction: Callable[[int, int], None] | None = None
    fold: Callable[[str, int, int], None] | None = None
    resumed: Callable[[str, int, int], None] | None = None


@dataclass(frozen=True)
class _Answers:
    """The labelled answers of one cross-validation and what each is grouped by."""

    examples: list[RAGExample]
    y: np.ndarray
    fold: np.ndarray
    groups: np.ndarray
    generators: np.ndarray
    datasets: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, examples: Sequence[RAGExample], k: int, seed: int) -> _Answers:
        exs = list(examples)
        y = label_array(exs)
        if not is_binary(y):
            raise DataError("cross-validation needs faithful and hallucinated answers")
        return cls(
            examples=exs,
            y=y,
            fold=make_folds(exs, k, seed),
            groups=np.asarray([source_key(e) for e in exs]),
            generators=np.asarray([e.provenance.generator or "unknown" for e in exs]),
            datasets=np.asarray([e.provenance.dataset or "unknown" for e in exs]),
            lengths=answer_lengths(exs),
        )


def cross_validate(
    model: LoadedModel | None,
    detectors: Sequence[str],
    examples: Sequence[RAGExample],
    options: CVOptions | None = None,
    *,
    datasets: Sequence[str] = (),
    make: MakeDetector | None = None,
    cache: FeatureCache | None = None,
    extraction: Extraction | None = None,
    model_key: str | None = None,
    progress: CVProgress | None = None,
) -> CVRun:
    """Score every answer out of fold once, for every detector (see the module docstring).

    Args:
        model: The analysing model.
        detectors: Detector names.
        examples: Labelled answers (several datasets may be combined; each keeps its
            ``provenance.dataset``).
        options: How it runs (:class:`CVOptions`; default: 5 folds, seed 0).
        datasets: Names recorded for the data.
        make: Builds a fresh detector by name (default: :func:`make_detector`).
        cache: Feature cache.
        extraction: Features already extracted for ``examples`` (skips extraction; then
            ``model`` may be ``None`` with ``model_key`` given).
        model_key: The model's key to record (default: ``model.info.key``).
        progress: What it reports as it goes (:class:`CVProgress`).
    """
    opts = options or CVOptions()
    report = progress or CVProgress()
    make = make or default_maker()
    if extraction is None:
        if model is None:
            raise DataError("cross-validation needs the model to extract features")
        extraction = extract_all(
            model, examples, detectors, make, cache=cache, progress=report.extraction
        )
    ext = extraction
    key = model_key or (model.info.key if model is not None else None)
    if key is None:
        raise DataError("cross-validation needs the model or its key to record")
    ans = _Answers.of(ext.examples, opts.k, opts.seed)
    exs, y, groups = ans.examples, ans.y, ans.groups
    run_parts = {
        "ids": ids_hash(exs),
        "data": data_hash(exs),
        "fold": hashlib.sha256(ans.fold.astype(np.int64).tobytes()).hexdigest(),
        "model": key,
        **opts.fold_parts(),
    }
    results = [
        _validate_detector(n, ext.features[n], ans, make, opts, report, run_parts)
        for n in detectors
    ]
    stamp = datetime.now(UTC)
    names = tuple(datasets) or tuple(sorted(set(ans.datasets.tolist())))
    comparisons = compare_detectors(
        y,
        {r.detector: np.asarray(r.scores) for r in results},
        groups,
        ans.lengths,
        n_boot=opts.n_boot,
        seed=opts.seed,
    )
    return CVRun(
        name=opts.name or file_stem(f"{stamp:%Y%m%d-%H%M%S}-cv{opts.k}-{'+'.join(names)}"),
        created_at=stamp.isoformat(timespec="seconds"),
        model=key,
        datasets=names,
        k=opts.k,
        seed=opts.seed,
        criterion=opts.criterion,
        calibrate_on=tuple(opts.calibrate_on) if opts.calibrate_on is not None else None,
        calibration=opts.calibration,
        baseline={
            "answer_length": {
                "auroc": auroc_or_none(y, ans.lengths),
                "auroc_ci": grouped_bootstrap_ci(
                    y, ans.lengths, groups, n_boot=opts.n_boot, seed=opts.seed
                ),
                "length_bins": LENGTH_BINS,
            }
        },
        ids=tuple(e.id for e in exs),
        labels=tuple(int(v) for v in y),
        fold=tuple(int(f) for f in ans.fold),
        generators=tuple(ans.generators.tolist()),
        example_datasets=tuple(ans.datasets.tolist()),
        data_hash=data_hash(exs),
        results=tuple(results),
        extraction=_extraction_info(ext),
        # Hashed: a declared group may be a name from the data.
        groups=tuple(hashlib.sha256(str(g).encode()).hexdigest()[:12] for g in groups),
        comparisons=comparisons,
    )


def _fold(
    n: str,
    f: int,
    feats: Sequence[Features],
    ans: _Answers,
    make: MakeDetector,
    opts: CVOptions,
    report: CVProgress,
    fkey: str,
) -> FoldResult:
    """Fold ``f`` of detector ``n``: read back from the checkpoint, else fitted on the
    other folds and scored on this one (and then checkpointed)."""
    te = np.flatnonzero(ans.fold == f)
    res = load_fold(opts.checkpoint, fkey, te) if opts.checkpoint is not None else None
    if res is not None:
        if report.resumed is not None:
            report.resumed(n, f, opts.k)
        return res
    tr = np.flatnonzero(ans.fold != f).tolist()
    exs = ans.examples
    det = opts.fit(make, n, [feats[i] for i in tr], [exs[i] for i in tr], opts.seed + f)
    vs = [det.predict(feats[i]) for i in te.tolist()]
    own = [for_dataset(det, v, exs[i].provenance.dataset) for v, i in zip(vs, te, strict=True)]
    res = fold_result(
        te,
        vs,
        own,
        float(det.threshold_),
        det.config.config_hash(),
        getattr(det, "token_threshold_", None),
    )
    if opts.checkpoint is not None:
        save_fold(opts.checkpoint, fkey, res)
    return res


def _validate_detector(
    n: str,
    feats: Sequence[Features],
    ans: _Answers,
    make: MakeDetector,
    opts: CVOptions,
    report: CVProgress,
    run_parts: Mapping[str, Any],
) -> CVResult:
    """Detector ``n`` scored out of fold on every answer, and its metrics."""
    exs, y, groups, k, seed, n_boot = (
        ans.examples,
        ans.y,
        ans.groups,
        opts.k,
        opts.seed,
        opts.n_boot,
    )
    detector_hash = make(n).config.config_hash()
    scores = np.zeros(len(exs))
    raw = np.zeros(len(exs))
    flagged = np.zeros(len(exs), dtype=bool)
    own_scores = np.zeros(len(exs))
    own_flagged = np.zeros(len(exs), dtype=bool)
    verdicts: list[Verdict | None] = [None] * len(exs)
    token_thresholds: list[float | None] = [None] * len(exs)
    answer_thresholds: list[float | None] = [None] * len(exs)
    per_fold = []
    config_hash = ""
    for f in range(k):
        if report.fold is not None:
            report.fold(n, f, k)
        fkey = fold_key({**run_parts, "detector": n, "config": detector_hash, "f": f})
        res = _fold(n, f, feats, ans, make, opts, report, fkey)
        te = np.flatnonzero(ans.fold == f)
        config_hash = res.config_hash
        scores[te], raw[te], flagged[te] = res.scores, res.raw, res.flagged
        own_scores[te], own_flagged[te] = res.own_scores, res.own_flagged
        for j, i in enumerate(te):
            verdicts[i] = res.verdict(j, n, exs[i].id)
            token_thresholds[i] = res.token_threshold
            answer_thresholds[i] = res.threshold
        m = response_metrics(y[te], scores[te], res.threshold, n_boot=0)
        per_fold.append(
            {
                "fold": f,
                "n": int(te.size),
                "n_positive": int(y[te].sum()),
                "auroc": m["auroc"],
                "ap": m["ap"],
                "balanced_accuracy": m["balanced_accuracy"],
                "threshold": res.threshold,
                "ece": reliability(y[te], scores[te]).ece,
            }
        )
    done = [v for v in verdicts if v is not None]
    ty, ts = token_labels_and_scores(exs, done)
    pooled = pooled_metrics(y, scores, flagged, groups, n_boot, seed)
    pooled["auroc_length_matched"] = matched_auroc(y, scores, length_bins(ans.lengths, LENGTH_BINS))
    sets = ans.datasets
    return CVResult(
        detector=n,
        config_hash=config_hash,
        pooled=pooled,
        folds=tuple(per_fold),
        token=token_metrics(ty, ts) if ty.size else None,
        reliability=reliability(y, scores),
        by_generator=_breakdown(ans.generators, y, scores, flagged, groups, n_boot, seed),
        by_dataset=_with_tokens(
            _with_own(
                _breakdown(sets, y, scores, flagged, groups, n_boot, seed),
                _breakdown(sets, y, own_scores, own_flagged, groups, n_boot, seed),
            ),
            sets,
            exs,
            verdicts,
            token_thresholds,
        ),
        scores=tuple(float(s) for s in scores),
        raw_scores=tuple(float(s) for s in raw),
        flagged=tuple(bool(b) for b in flagged),
        spans=span_metrics(exs, verdicts, token_thresholds),
        span_rule=choose_span_rule(
            exs,
            verdicts,
            answer_thresholds,
            ans.fold.tolist(),
            groups.tolist(),
            n_boot=n_boot,
            seed=seed,
        ),
    )


def _extraction_info(ext: Extraction) -> dict[str, Any]:
    return {
        "computed": ext.computed,
        "cache_hits": ext.cache_hits,
        "errors": [str(e) for e in ext.errors[:20]],
        "n_errors": len(ext.errors),
        "seconds": ext.seconds,
    }
