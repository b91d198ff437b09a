"""Evaluation: source-grouped splits, metrics with bootstrap CIs, saved runs.

- :func:`split_examples` keeps every example of one source (same question and
  passages, or the dataset's own ``provenance.group``) in one split, and uses
  the dataset's own train/validation/test split when it declares one.
- :func:`evaluate` extracts features once for all detectors (cached), fits
  each detector on the training split (or loads artifacts), picks its
  threshold on validation, and reports on test: response-level AUROC with a
  bootstrap 95% CI, AP, balanced accuracy, F1, precision, recall and Pearson
  r; token-level AP and AUROC where the detector gives token scores.
- An :class:`EvalRun` saves as JSON (with model key, data hashes and config
  hashes) and renders as a markdown table; the Benchmark page reads them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.base.paths import runs_dir
from core.base.safeio import MiB, read_json_file, replace_file
from core.base.words import counted
from core.data import data_hash
from core.detectors import detector_class, make_detector
from core.engine.model import LoadedModel
from core.evaluation.recipe import TrainRecipe, trained_on_record
from core.learning.calibration import (
    DatasetCalibration,
    PlattCalibrator,
    enough_for_own,
    match_dataset,
)
from core.learning.contract import Detector, Features, Verdict, judge_features, own_raw_scores
from core.learning.labels import span_labels
from core.learning.metrics import (
    best_threshold,
    ci_columns,
    evidence_warning,
    is_binary,
    response_metrics,
    token_metrics,
)
from core.pipeline.extract import Extraction, FeatureCache, extract_features
from core.signals.smoothing import smooth_tokens

if TYPE_CHECKING:
    import pandas as pd

RUN_FORMAT = 1


# ----------------------------------------------------------------------------- splits


# ----------------------------------------------------------------------------- metrics


def token_labels_and_scores(
    examples: Sequence[RAGExample], verdicts: Sequence[Verdict]
) -> tuple[np.ndarray, np.ndarray]:
    """Every labelled token's gold label and score, concatenated: tokens of answers with
    gold spans, and of faithful answers without spans (all 0)."""
    labs, scores = [], []
    for e, v in zip(examples, verdicts, strict=True):
        if v.token_scores is None:
            continue
        lab = span_labels(v.token_offsets, e)
        if lab is None and e.label is False:
            lab = np.zeros(len(v.token_scores), dtype=np.int8)
        if lab is not None:
            labs.append(lab)
            scores.append(np.asarray(v.token_scores, dtype=np.float64))
    if not labs:
        return np.zeros(0, np.int8), np.zeros(0)
    return np.concatenate(labs), np.concatenate(scores)


def token_threshold(examples: Sequence[RAGExample], verdicts: Sequence[Verdict]) -> float | None:
    """The token-score threshold with the best token F1 on these (validation) answers;
    ``None`` when the detector scores no token or the tokens are all of one class. The
    threshold to flag spans with (answer-level thresholds live on another scale)."""
    from sklearn.metrics import precision_recall_curve

    y, s = token_labels_and_scores(examples, verdicts)
    if y.size == 0 or not is_binary(y):
        return None
    precision, recall, thresholds = precision_recall_curve(y, s)
    p, r = precision[:-1], recall[:-1]
    f1 = np.divide(2 * p * r, p + r, out=np.zeros_like(p), where=(p + r) > 0)
    return float(thresholds[int(np.argmax(f1))])


# ----------------------------------------------------------------------------- runs


def file_stem(name: str) -> str:
    """A run name as a safe file name: other characters than letters, digits and
    ``._+-`` become ``_`` (no folders, no hidden files)."""
    stem = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return stem[:200] or "run"


def save_run(name: str, d: Mapping[str, Any], md: str, folder: str | Path) -> tuple[Path, Path]:
    """A run's JSON ``d`` and markdown ``md`` as ``<stem>.json`` and ``<stem>.md`` in
    ``folder`` (:func:`file_stem` of ``name``), each written new and renamed over any
    earlier one (:func:`~core.base.safeio.replace_file`)."""
    out = Path(folder)
    stem = file_stem(name)
    j = replace_file(out / f"{stem}.json", json.dumps(d, indent=1) + "\n")
    m = replace_file(out / f"{stem}.md", md + "\n")
    return j, m


@dataclass(frozen=True, kw_only=True)
class DetectorResult:
    """One detector's test results in a run."""

    detector: str
    config_hash: str
    threshold: float
    metrics: Mapping[str, Any]
    token_metrics: Mapping[str, Any] | None
    validation_metrics: Mapping[str, Any] | None
    scores: tuple[float, ...]  # aligned with EvalRun.test_ids
    artifact: str | None = None
    token_threshold: float | None = None


RUN_JSON_LIMIT = 256 * MiB
"""Largest evaluation run file read (one score per test answer and detector)."""


@dataclass(frozen=True, kw_only=True)
class EvalRun:
    """A saved evaluation: what was run, on what, and how each detector did."""

    name: str
    created_at: str
    model: str
    train_dataset: str
    test_dataset: str
    data_hashes: Mapping[str, str]
    split_sizes: Mapping[str, int]
    test_ids: tuple[str, ...]
    test_labels: tuple[int, ...]
    test_tasks: tuple[str, ...]
    test_generators: tuple[str, ...]
    results: tuple[DetectorResult, ...]
    extraction: Mapping[str, Any] = field(default_factory=dict)
    format: int = RUN_FORMAT

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["results"] = [dict(vars(r)) for r in self.results]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalRun:
        if d.get("format") != RUN_FORMAT:
            raise DataError(
                f"evaluation run format {d.get('format')!r} is not {RUN_FORMAT}; re-run it"
            )
        kw = dict(d)
        kw["results"] = tuple(
            DetectorResult(**{**r, "scores": tuple(r["scores"])}) for r in d["results"]
        )
        for k in ("test_ids", "test_labels", "test_tasks", "test_generators"):
            kw[k] = tuple(d[k])
        return cls(**kw)

    def save(self, folder: str | Path) -> tuple[Path, Path]:
        """Write ``<name>.json`` and ``<name>.md`` into ``folder`` (:func:`save_run`)."""
        return save_run(self.name, self.to_dict(), self.to_markdown(), folder)

    @classmethod
    def load(cls, path: str | Path) -> EvalRun:
        d = read_json_file(path, RUN_JSON_LIMIT, what="evaluation run")
        if not isinstance(d, dict):
            raise DataError("not a readable evaluation run (not a JSON object)", source=str(path))
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"not a readable evaluation run ({e})", source=str(path)) from e

    def to_frame(self) -> pd.DataFrame:
        """One row per detector with the headline test metrics."""
        import pandas as pd

        rows = []
        for r in self.results:
            m = r.metrics
            ci = m.get("auroc_ci") or [None, None]
            rows.append(
                {
                    "detector": r.detector,
                    "AUROC": m.get("auroc"),
                    **dict(zip(ci_columns("AUROC"), ci, strict=True)),
                    "AP": m.get("ap"),
                    "balanced acc": m.get("balanced_accuracy"),
                    "F1": m.get("f1"),
                    "precision": m.get("precision"),
                    "recall": m.get("recall"),
                    "Pearson r": m.get("pearson_r"),
                    "threshold": r.threshold,
                    "token AP": (r.token_metrics or {}).get("ap"),
                    "token AUROC": (r.token_metrics or {}).get("auroc"),
                    "token AP smoothed": _smoothed(r).get("ap"),
                    "token AUROC smoothed": _smoothed(r).get("auroc"),
                }
            )
        return pd.DataFrame(rows)

    @property
    def evidence(self) -> str | None:
        """Why this run's test metrics are not to be read as facts, with what would fix it
        (:func:`core.learning.metrics.evidence_warning` of its test labels); ``None`` when there
        are enough answers of both classes."""
        return evidence_warning(self.test_labels, "The test answers")

    def to_markdown(self) -> str:
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.3f}"

        p_stay = next((_smoothed(r)["p_stay"] for r in self.results if _smoothed(r)), None)
        extra_head = (
            f" token AP (smoothed {p_stay}) | token AUROC (smoothed {p_stay}) |" if p_stay else ""
        )
        lines = [
            f"# {self.name}",
            "",
            f"model `{self.model}`; train `{self.train_dataset}` -> test `{self.test_dataset}`; "
            f"splits {dict(self.split_sizes)}; data hashes {dict(self.data_hashes)}",
            "",
            "| detector | AUROC [95% CI] | AP | bal. acc | F1 | P | R | r | token AP | token AUROC |"
            + extra_head,
            "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if p_stay else ""),
        ]
        for r in self.results:
            m, t = r.metrics, r.token_metrics or {}
            ci = m.get("auroc_ci")
            auroc = f(m.get("auroc")) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            sm = _smoothed(r)
            lines.append(
                f"| {r.detector} | {auroc} | {f(m.get('ap'))} | {f(m.get('balanced_accuracy'))} | "
                f"{f(m.get('f1'))} | {f(m.get('precision'))} | {f(m.get('recall'))} | "
                f"{f(m.get('pearson_r'))} | {f(t.get('ap'))} | {f(t.get('auroc'))} |"
                + (f" {f(sm.get('ap'))} | {f(sm.get('auroc'))} |" if p_stay else "")
            )
        warn = self.evidence
        if warn:
            lines += ["", f"**Too few answers.** {warn}"]
        ex = self.extraction
        if ex:
            lines += [
                "",
                f"feature extraction: {ex.get('computed')} computed, {ex.get('cache_hits')} from cache, "
                f"{ex.get('seconds', 0):.1f} s ({ex.get('examples_per_minute', 0):.1f} examples/min)",
            ]
        return "\n".join(lines)

    def breakdown(self, by: Literal["task", "generator"]) -> pd.DataFrame:
        """AUROC / F1 per task or generator for every detector."""
        import pandas as pd

        keys = np.asarray(self.test_tasks if by == "task" else self.test_generators)
        y = np.asarray(self.test_labels)
        rows = []
        for r in self.results:
            s = np.asarray(r.scores)
            for k in sorted(set(keys.tolist())):
                mask = keys == k
                m = response_metrics(y[mask], s[mask], r.threshold, n_boot=0)
                rows.append(
                    {
                        "detector": r.detector,
                        by: k,
                        "n": int(mask.sum()),
                        "AUROC": m["auroc"],
                        "F1": m["f1"],
                    }
                )
        return pd.DataFrame(rows)


def _smoothed(result: DetectorResult) -> Mapping[str, Any]:
    """A result's token metrics after smoothing (empty when the run did not smooth)."""
    return (result.token_metrics or {}).get("smoothed") or {}


RUN_STAMP = re.compile(r"^(\d{8}-\d{6})")
"""The creation time that starts a run's file name (``20261127-102453-cv5-...``)."""


def run_time(path: Path) -> str:
    """When a saved run was made, as ``YYYYmmdd-HHMMSS`` (UTC): the stamp its name starts
    with, else the file's modification time (a clone gives every file the same one)."""
    m = RUN_STAMP.match(path.name)
    if m is not None:
        return m.group(1)
    return datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y%m%d-%H%M%S")


def list_runs(folder: str | Path | None = None) -> list[Path]:
    """Saved run JSON files, newest first (:func:`run_time`; ties by name)."""
    d = Path(folder) if folder is not None else runs_dir()
    if not d.is_dir():
        return []
    return sorted(d.glob("*.json"), key=lambda p: (run_time(p), p.name), reverse=True)


# ----------------------------------------------------------------------------- evaluate


def _labels(examples: Sequence[RAGExample], what: str) -> np.ndarray:
    missing = [e.id for e in examples if e.label is None]
    if missing:
        raise DataError(
            f"{counted(len(missing), f'{what} example')} "
            f"{'is' if len(missing) == 1 else 'are'} unlabelled (first {missing[0]!r}); "
            "evaluation needs labels"
        )
    return np.asarray([int(bool(e.label)) for e in examples])


def _subset(ext: Extraction, ids: set[str]) -> tuple[list[RAGExample], dict[str, list[Any]]]:
    idx = [i for i, e in enumerate(ext.examples) if e.id in ids]
    return [ext.examples[i] for i in idx], {
        n: [fs[i] for i in idx] for n, fs in ext.features.items()
    }


def accepts_validation(det: Detector) -> bool:
    """Whether ``det.fit`` takes a ``validation=`` split (to select hyper-parameters on)."""
    return "validation" in inspect.signature(det.fit).parameters


def fit_detector(
    det: Detector,
    features: Sequence[Features],
    examples: Sequence[RAGExample],
    validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
) -> None:
    """``det.fit`` on the training answers, passing ``validation`` to detectors that
    select hyper-parameters on it (:func:`accepts_validation`); the test answers never
    reach ``fit``."""
    fit: Any = det.fit  # the protocol's fit has no validation keyword; some fits do
    if validation is not None and len(validation[0]) and accepts_validation(det):
        fit(features, examples, validation=validation)
    else:
        fit(features, examples)


def set_thresholds(
    det: Detector,
    features: Sequence[Features],
    examples: Sequence[RAGExample],
    *,
    criterion: Literal["f1", "balanced_accuracy"] = "f1",
    calibrate: Sequence[bool] | None = None,
    raw_verdicts: Sequence[Verdict] | None = None,
    by_dataset: bool = False,
) -> list[Verdict]:
    """Finish a fitted detector on held-out (validation) answers it never learned from.

    With ``calibrate`` (one flag per answer: use it for calibration), first fit a
    :class:`~core.learning.calibration.PlattCalibrator` on the flagged answers' scores, so the
    detector's scores become probabilities calibrated on that data. Then pick the
    answer threshold maximising ``criterion`` (on the flagged answers when given,
    calibrated scale) and the token threshold (best token F1). Without ``calibrate`` a
    calibration the detector already has (a loaded artifact's) is kept. Returns the
    held-out verdicts, after calibration.

    ``raw_verdicts`` (with ``calibrate``) are uncalibrated verdicts on these answers from
    elsewhere — cross-fitted ones, each from a model that never saw its answer — used
    instead of ``det``'s own; ``features`` are then not read.

    With ``by_dataset`` (and ``calibrate``), answers from two or more datasets
    (``provenance.dataset``) also give each dataset with enough of them
    (:data:`~core.learning.calibration.MIN_DATASET_ANSWERS`, and
    :data:`~core.learning.calibration.MIN_DATASET_CLASS` of each class) a calibrator and
    threshold of its own, fitted on its answers alone (``det.dataset_calibration_``);
    the pooled ones stay the default for answers of no known dataset. A detector with
    scorers of datasets' own (the ensemble's ``dataset_stackers``) has each such
    dataset's calibration fitted on that scorer's raw scores
    (:func:`~core.learning.contract.own_raw_scores`).

    Raises:
        DataError: The calibration answers are all of one class, or ``raw_verdicts``
            without ``calibrate`` or of the wrong length.
    """
    y = _labels(examples, "validation")
    use = np.ones(len(examples), bool) if calibrate is None else np.asarray(calibrate, bool)
    if raw_verdicts is not None and (calibrate is None or len(raw_verdicts) != len(examples)):
        raise DataError("raw verdicts need calibration flags and one verdict per answer")
    if calibrate is not None:
        det.calibration_ = None  # the raw scores are what is calibrated
        if not is_binary(y[use]):
            raise DataError(
                "the calibration answers need faithful and hallucinated ones; calibrate on "
                "more (or other) datasets"
            )
        raw_v = (
            list(raw_verdicts) if raw_verdicts is not None else [det.predict(f) for f in features]
        )
        raw = np.asarray([v.score for v in raw_v])
        cal = PlattCalibrator().fit(raw[use], y[use])
        det.calibration_ = cal
        det.dataset_calibration_ = (
            dataset_calibrations(
                examples,
                own_raw_scores(raw_v, [e.provenance.dataset for e in examples]),
                y,
                criterion,
            )
            if by_dataset
            else {}
        )
        verdicts = [
            dataclasses.replace(
                v, score=float(p), raw_score=v.score, hallucinated=None, threshold=None
            )
            for v, p in zip(raw_v, np.clip(cal.transform(raw), 0.0, 1.0), strict=True)
        ]
    else:
        verdicts = [det.predict(f) for f in features]
    scores = np.asarray([v.score for v in verdicts])
    det.threshold_ = best_threshold(y[use], scores[use], criterion)
    det.token_threshold_ = token_threshold(examples, verdicts)
    # The verdicts were judged before the threshold existed: judge them at it.
    thr = float(det.threshold_)
    return [dataclasses.replace(v, hallucinated=v.score >= thr, threshold=thr) for v in verdicts]


def dataset_calibrations(
    examples: Sequence[RAGExample],
    raw: np.ndarray,
    y: np.ndarray,
    criterion: Literal["f1", "balanced_accuracy"],
) -> dict[str, DatasetCalibration]:
    """Each dataset's own calibrator and threshold from its answers' raw scores ``raw``
    and labels ``y`` (see :func:`set_thresholds`'s ``by_dataset``); empty when the
    answers come from fewer than two datasets."""
    names = np.asarray([e.provenance.dataset or "" for e in examples])
    known = sorted({n for n in names.tolist() if n})
    if len(known) < 2:
        return {}
    out = {}
    for name in known:
        mask = names == name
        if enough_for_own(y[mask]):
            out[name] = fit_dataset_calibration(raw[mask], y[mask], criterion)
    return out


def fit_dataset_calibration(
    raw: np.ndarray, y: np.ndarray, criterion: Literal["f1", "balanced_accuracy"]
) -> DatasetCalibration:
    """One dataset's own calibrator (Platt on its answers' raw scores ``raw``) and the
    threshold ``criterion`` picks on the calibrated probabilities of the same answers.

    Raises:
        DataError: One class only, or lengths that differ.
    """
    y = np.asarray(y).astype(int)
    cal = PlattCalibrator().fit(raw, y)
    probs = np.clip(cal.transform(raw), 0.0, 1.0)
    return DatasetCalibration(
        calibrator=cal,
        threshold=float(best_threshold(y, probs, criterion)),
        n=int(y.size),
        n_positive=int(y.sum()),
    )


def _judged_by(
    det: Detector, name: str, example: RAGExample, experts: Mapping[str, Mapping[str, Detector]]
) -> Detector:
    """The detector that judges ``example`` for ``name``: its dataset's expert's, else
    ``det``."""
    found = match_dataset(experts, example.provenance.dataset)
    return found[1].get(name, det) if found is not None else det


def _token_metrics(
    te_ex: Sequence[RAGExample], verdicts: Sequence[Verdict], smooth: float | None
) -> dict[str, Any] | None:
    """Token metrics over the test answers with token labels (``None`` when none has
    them), and after smoothing with ``p_stay = smooth`` when asked."""
    tok_lab, tok_sc = [], []
    for e, v in zip(te_ex, verdicts, strict=True):
        y_tok, s_tok = token_labels_and_scores([e], [v])
        if y_tok.size:
            tok_lab.append(y_tok)
            tok_sc.append(s_tok)
    if not tok_lab:
        return None
    tok = token_metrics(np.concatenate(tok_lab), np.concatenate(tok_sc))
    if smooth is not None:
        smoothed = np.concatenate(smooth_tokens(tok_sc, smooth))
        tok["smoothed"] = {
            "p_stay": float(smooth),
            **token_metrics(np.concatenate(tok_lab), smoothed),
        }
    return tok


def _evaluate_one(
    n: str,
    det: Any,
    parts: Mapping[str, tuple[list[RAGExample], dict[str, list[Features]]]],
    labels: Mapping[str, np.ndarray],
    opts: EvalOptions,
    splits: Splits,
    artifact: str | Path | None,
    experts: Mapping[str, Mapping[str, Detector]],
) -> DetectorResult:
    """Detector ``n`` fitted on train (unless loaded from ``artifact``), thresholded on
    validation, judged on test, and saved when asked."""
    (tr_ex, tr_f), (va_ex, va_f), (te_ex, te_f) = (
        parts["train"],
        parts["validation"],
        parts["test"],
    )
    if artifact is None:
        # Detectors that select hyper-parameters (heads, layers, beta, a classifier)
        # do it on validation, never on test.
        fit_detector(det, tr_f[n], tr_ex, (va_f[n], va_ex))
    va_metrics = None
    if va_ex:
        va_verdicts = set_thresholds(det, va_f[n], va_ex, criterion=opts.threshold_criterion)
        va_scores = np.asarray([v.score for v in va_verdicts])
        va_metrics = response_metrics(labels["validation"], va_scores, det.threshold_, n_boot=0)
    # A detector trained on several datasets judges each answer by its dataset's own
    # calibration and threshold when it has them.
    judging = [_judged_by(det, n, e, experts) for e in te_ex]
    verdicts = [
        judge_features(d, f, e.provenance.dataset)
        for d, f, e in zip(judging, te_f[n], te_ex, strict=True)
    ]
    scores = np.asarray([v.score for v in verdicts])
    tok = _token_metrics(te_ex, verdicts, opts.smooth)
    # Each answer is flagged at the threshold of the calibration that gave its score.
    thresholds = np.asarray(
        [
            d.threshold_ if v.threshold is None else v.threshold
            for d, v in zip(judging, verdicts, strict=True)
        ],
        dtype=np.float64,
    )
    metrics = response_metrics(labels["test"], scores, thresholds, n_boot=opts.n_boot)
    art = None
    if opts.save_artifacts is not None and artifact is None:
        art = str(
            det.save(
                Path(opts.save_artifacts) / n,
                extra={
                    "trained_on": trained_on_record(
                        opts.recipe,
                        dataset=splits.train_dataset,
                        parts={"train": tr_ex, "validation": va_ex, "test": te_ex},
                        fitted=[*tr_ex, *va_ex],
                    ),
                    "threshold_criterion": opts.threshold_criterion,
                    "token_threshold": getattr(det, "token_threshold_", None),
                    "metrics": {"test": metrics, "validation": va_metrics, "token": tok},
                },
            )
        )
    elif artifact is not None:
        art = str(artifact)
    return DetectorResult(
        detector=n,
        config_hash=det.config.config_hash(),
        # The threshold the test answers were flagged at (their dataset's own
        # when one calibration judged them all; see metrics["thresholds"]).
        threshold=float(det.threshold_ if metrics["threshold"] is None else metrics["threshold"]),
        metrics=metrics,
        token_metrics=tok,
        validation_metrics=va_metrics,
        scores=tuple(float(s) for s in scores),
        artifact=art,
        token_threshold=getattr(det, "token_threshold_", None),
    )


@dataclass(frozen=True, kw_only=True)
class Splits:
    """The answers of one held-out evaluation and the dataset names its run records.

    Attributes:
        train, validation, test: The splits (train may be empty when every detector
            comes from artifacts; validation is empty when artifacts are judged as
            trained).
        train_dataset, test_dataset: Names recorded in the run (the test one defaults to
            the training one).
    """

    train: Sequence[RAGExample]
    validation: Sequence[RAGExample]
    test: Sequence[RAGExample]
    train_dataset: str
    test_dataset: str | None = None

    @classmethod
    def of(
        cls,
        parts: Mapping[str, Sequence[RAGExample]],
        train_dataset: str,
        test_dataset: str | None = None,
    ) -> Splits:
        """The splits of ``parts`` (``train``, ``validation``, ``test``, as
        :func:`core.data.splits.make_splits` gives them)."""
        return cls(
            train=parts["train"],
            validation=parts["validation"],
            test=parts["test"],
            train_dataset=train_dataset,
            test_dataset=test_dataset,
        )


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """How a held-out evaluation runs and what it keeps.

    Attributes:
        threshold_criterion: What the validation threshold maximises.
        n_boot: Bootstrap resamples for the AUROC CI.
        name: Run name (default: timestamp + datasets).
        smooth: Also report token metrics after label-persistence smoothing of every
            detector's token scores with this ``p_stay`` (:mod:`core.signals.smoothing`),
            under ``token_metrics["smoothed"]``.
        save_artifacts: Folder to save each freshly trained detector in
            (``<folder>/<name>/``), with threshold, training data hashes and metrics.
        recipe: The inputs that rebuild the saved artifacts, recorded in each artifact
            (:func:`core.evaluation.recipe.trained_on_record`) for ``ragscope train
            --reproduce``.
    """

    threshold_criterion: Literal["f1", "balanced_accuracy"] = "f1"
    n_boot: int = 1000
    name: str | None = None
    smooth: float | None = None
    save_artifacts: str | Path | None = None
    recipe: TrainRecipe | None = None


def evaluate(
    model: LoadedModel,
    detectors: Sequence[str],
    splits: Splits,
    options: EvalOptions | None = None,
    *,
    artifacts: Mapping[str, str | Path] | None = None,
    loaded: Mapping[str, Detector] | None = None,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    experts: Mapping[str, Mapping[str, Detector]] | None = None,
    cache: FeatureCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EvalRun:
    """Fit (or load) each detector, pick thresholds on validation, report on test.

    Args:
        model: The analysing model.
        detectors: Registered detector names.
        splits: The answers and the names recorded for them (:class:`Splits`).
        options: How it runs and what it keeps (:class:`EvalOptions`).
        artifacts: Detector name -> artifact folder to load instead of training.
        loaded: Detector name -> the detector already loaded from its ``artifacts``
            folder (it is not read again).
        configs: Detector name -> config options for freshly made detectors
            (e.g. ``{"redeep_token": {"scorer": "logistic"}}``).
        experts: For loaded artifacts judged as trained (no validation split): training
            dataset -> the detectors of the set's expert for it
            (:meth:`core.pipeline.sets.DetectorSet.for_dataset`). A test answer of that
            dataset (or another split of it, :func:`core.learning.calibration.match_dataset`)
            is judged by the expert's detector of the same name, on the same features, as
            every other path judges it.
        cache: Feature cache (recommended: evaluation re-runs then cost nothing).
        progress: ``(done, total)`` over all examples.
    """
    opts = options or EvalOptions()
    artifacts = dict(artifacts or {})
    experts = dict(experts or {})
    if experts and (splits.validation or any(n not in artifacts for n in detectors)):
        raise DataError("experts judge only loaded artifacts as trained (no validation split)")
    dets: dict[str, Any] = {}
    configs = dict(configs or {})
    unknown = sorted(set(configs) - set(detectors))
    if unknown:
        raise DataError(f"options given for detectors not being run: {unknown}")
    loaded = dict(loaded or {})
    if set(loaded) - set(artifacts):
        raise DataError(
            f"loaded detectors without their artifact folder: {sorted(set(loaded) - set(artifacts))}"
        )
    for n in detectors:
        if n in loaded:
            dets[n] = loaded[n]
        elif n in artifacts:
            dets[n] = detector_class(n).load(artifacts[n], model_key=model.info.key)
        else:
            dets[n] = make_detector(n, **configs.get(n, {}))
    if any(n not in artifacts for n in detectors) and not splits.train:
        raise DataError(
            "no training examples: give a training split or artifacts for every detector"
        )
    everything = [*splits.train, *splits.validation, *splits.test]
    ids = [e.id for e in everything]
    if len(set(ids)) != len(ids):
        raise DataError("example ids repeat across splits; ids must be unique")
    ext = extract_features(
        model, everything, list(dets.values()), cache=cache, progress=progress, on_error="skip"
    )
    parts = {
        part: _subset(ext, {e.id for e in getattr(splits, part)})
        for part in ("train", "validation", "test")
    }
    te_ex = parts["test"][0]
    if not te_ex:
        raise DataError("the test split is empty after extraction; use a larger dataset")
    tr_ex, va_ex = parts["train"][0], parts["validation"][0]
    y_te = _labels(te_ex, "test")
    labels = {"test": y_te, "validation": _labels(va_ex, "validation") if va_ex else np.zeros(0)}
    results = [
        _evaluate_one(n, det, parts, labels, opts, splits, artifacts.get(n), experts)
        for n, det in dets.items()
    ]
    hashes = {"train": data_hash(tr_ex), "validation": data_hash(va_ex), "test": data_hash(te_ex)}
    train_dataset, name = splits.train_dataset, opts.name
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    test_name = splits.test_dataset or train_dataset
    return EvalRun(
        name=name or f"{stamp}-{train_dataset}-to-{test_name}".replace("/", "_"),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        model=model.info.key,
        train_dataset=train_dataset,
        test_dataset=test_name,
        data_hashes=hashes,
        split_sizes={"train": len(tr_ex), "validation": len(va_ex), "test": len(te_ex)},
        test_ids=tuple(e.id for e in te_ex),
        test_labels=tuple(int(v) for v in y_te),
        test_tasks=tuple(e.task for e in te_ex),
        test_generators=tuple(e.provenance.generator or "unknown" for e in te_ex),
        results=tuple(results),
        extraction={
            "computed": ext.computed,
            "cache_hits": ext.cache_hits,
            "errors": [str(e) for e in ext.errors[:20]],
            "n_errors": len(ext.errors),
            "seconds": ext.seconds,
            "examples_per_minute": ext.examples_per_minute,
        },
    )
