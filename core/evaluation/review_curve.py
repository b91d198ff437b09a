"""Learning curves of the review loop: how many reviewed answers a dataset needs before
the set adapted to it (:mod:`core.evaluation.adapt`) reads its other answers well.

Reviewers are simulated by the gold labels of a labelled dataset. The base set's
reading of each answer comes from its recorded cross-validation run (the judge's
``raw_scores`` and ``scores`` out of fold: each answer read by a model that never saw
it; the members' runs for the refit), so no answer is traced again. For each ordering
(``random``: a fresh random sample per seed; ``uncertainty``: a first random batch of
:data:`FIRST_BATCH`, then the answers whose base probability is nearest the base
threshold, as the Review page orders them), each number of reviews ``n`` and each
seed, the first ``n`` answers are "reviewed" and:

- **calibration** (the adaptation the app runs): the reviews drawn at random calibrate
  the judge once there are enough (:func:`~core.evaluation.adapt.fit_adaptation`'s
  rule and minimum), else the base reading stands;
- **refit** (the adaptation's ``--refit``, the same functions): the reviewed stacker
  (:func:`~core.evaluation.adapt.fit_refit`) over the members' logits and the judge's
  logit (the members' and the judge's recorded out-of-fold raw scores; the job reads the
  members' verdicts and the pooled stacker, the same up to each member's Platt
  scaling, which standardising absorbs), fitted on every reviewed answer; its
  calibration fitted on its out-of-fold scores of the reviews drawn at random.

Each is scored on the answers **not reviewed**: ECE, balanced accuracy at the adapted
threshold and AUROC (the refit's AUROC), averaged over seeds with 2.5/97.5 percentiles.
Two references: the base reading (**unadapted**, on the same remaining answers) and the
dataset's **own 5-fold CV** of the same procedure (calibration and stacker fitted on four
fifths of the answers, scored on the fifth): what every answer reviewed would give.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import StratifiedKFold

from core.base.errors import DataError, brief
from core.data.sampling import random_order
from core.evaluation.adapt import fit_refit, fit_review_calibration, missing_reviews
from core.evaluation.cv_run import read_run
from core.evaluation.evaluate import save_run
from core.learning.artifact import cfg_at, read_artifact_cfg
from core.learning.calibration import expected_calibration_error, logit
from core.pipeline.sets import ANSWER_JUDGE

SIZES: tuple[int, ...] = (10, 25, 50, 100, 200)
ORDERS: tuple[str, ...] = ("random", "uncertainty")
SEEDS = 20
FIRST_BATCH = 10
"""The uncertainty order's first batch, drawn at random (nothing is known before it)."""
MIN_REST = 20
"""The fewest answers left to score a point on (larger ``n`` are skipped)."""
METRICS: tuple[str, ...] = (
    "ece",
    "balanced_accuracy",
    "auroc",
    "refit_auroc",
    "refit_ece",
    "refit_balanced_accuracy",
)
KIND = "review-curve"


@dataclass(frozen=True, kw_only=True)
class CurveData:
    """One dataset's answers as the base set reads them out of fold.

    Attributes:
        raw: The judge's raw score (what a dataset's own calibration reads).
        prob, flagged: The judge's recorded probability and verdict (the base reading).
        members: Member name -> its raw score per answer (NaN: none), for the refit.
    """

    dataset: str
    judge: str
    ids: tuple[str, ...]
    y: np.ndarray
    raw: np.ndarray
    prob: np.ndarray
    flagged: np.ndarray
    members: Mapping[str, np.ndarray]
    runs: tuple[str, ...]

    @property
    def threshold(self) -> float:
        """The base reading's threshold: the lowest flagged probability (the recorded
        verdicts are probability >= threshold), 1 when none is flagged."""
        return float(self.prob[self.flagged].min()) if self.flagged.any() else 1.0


def _column(run: Mapping[str, Any], detector: str, key: str, n: int) -> np.ndarray:
    for r in run.get("results", []):
        if isinstance(r, dict) and r.get("detector") == detector:
            values = r.get(key)
            if not isinstance(values, list) or len(values) != n:
                raise DataError(f"the run's {detector} {key} are not one per answer")
            return np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    raise DataError(f"the run has no {detector} results")


def curve_data(
    run: Mapping[str, Any],
    dataset: str,
    judge: str,
    member_runs: Mapping[str, Mapping[str, Any]] | None = None,
) -> CurveData:
    """``dataset``'s answers in a cross-validation run (``CVRun.to_dict``), with the
    judge's out-of-fold scores and each member's raw scores from its own run (aligned by
    answer id; a member whose run lacks an answer is left out of the refit).

    Raises:
        DataError: The run has no such dataset or detector, or is malformed.
    """
    ids, labels, names = run.get("ids"), run.get("labels"), run.get("example_datasets")
    if not (isinstance(ids, list) and isinstance(labels, list) and isinstance(names, list)):
        raise DataError("not a cross-validation run with per-answer ids, labels and datasets")
    n = len(ids)
    if len(labels) != n or len(names) != n:
        raise DataError("the run's ids, labels and datasets differ in length")
    mask = np.asarray([d == dataset for d in names], dtype=bool)
    if not mask.any():
        known = sorted({str(d) for d in names})
        raise DataError(f"the run has no answers of {dataset!r}; it has {known}")
    y = np.asarray([bool(v) for v in labels], dtype=bool)[mask]
    flagged = _column(run, judge, "flagged", n)
    members: dict[str, np.ndarray] = {}
    for name, mrun in (member_runs or {}).items():
        m_ids = mrun.get("ids")
        if not isinstance(m_ids, list):
            continue
        col = _column(mrun, name, "raw_scores", len(m_ids))
        where = {str(i): k for k, i in enumerate(m_ids)}
        if all(str(i) in where for i in np.asarray(ids, dtype=object)[mask]):
            members[name] = np.asarray(
                [col[where[str(i)]] for i in np.asarray(ids, dtype=object)[mask]]
            )
    return CurveData(
        dataset=dataset,
        judge=judge,
        ids=tuple(str(i) for i in np.asarray(ids, dtype=object)[mask]),
        y=y,
        raw=_column(run, judge, "raw_scores", n)[mask],
        prob=_column(run, judge, "scores", n)[mask],
        flagged=flagged[mask] > 0.5,
        members=members,
        runs=(
            str(run.get("name", "")),
            *dict.fromkeys(str(r.get("name", "")) for r in (member_runs or {}).values()),
        ),
    )


def _scores(y: np.ndarray, p: np.ndarray, thr: float) -> dict[str, float]:
    both = 0 < y.sum() < y.size
    return {
        "ece": float(expected_calibration_error(y, p)),
        "balanced_accuracy": float(balanced_accuracy_score(y, p >= thr)) if both else math.nan,
        "auroc": float(roc_auc_score(y, p)) if both else math.nan,
    }


def _stack_features(data: CurveData) -> np.ndarray:
    cols = [data.raw, *data.members.values()]
    return np.column_stack(
        [logit(np.clip(c, 0.0, 1.0)) if np.isfinite(c).any() else c for c in cols]
    )


def _refit_scores(
    x: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    calibrate: np.ndarray,
    test: np.ndarray,
    without: Mapping[str, float],
) -> dict[str, float]:
    """The refit's scores on ``test``: the reviewed stacker fitted on ``train`` (the
    judge's logit, column 0 of ``x``, its base reading), its calibration on its
    out-of-fold scores of ``calibrate`` (a subset of ``train``; none when too few: ECE and
    balanced accuracy are then NaN, AUROC stands). A stacker the rule does not keep
    leaves the adaptation without a refit: ``without``'s scores (``refit_kept`` 0)."""
    nan = {"refit_auroc": math.nan, "refit_ece": math.nan, "refit_balanced_accuracy": math.nan}
    got = fit_refit(x[train], y[train], base=x[train, 0])
    if not 0 < y[test].sum() < test.sum():
        return {**nan, "refit_kept": math.nan}
    if got.stacker is None or got.out_of_fold is None:
        kept = {f"refit_{k}": without[k] for k in ("auroc", "ece", "balanced_accuracy")}
        return {**kept, "refit_kept": 0.0}
    raw = got.stacker.predict_proba(x[test])
    out = {**nan, "refit_auroc": float(roc_auc_score(y[test], raw)), "refit_kept": 1.0}
    use = calibrate[train]
    if missing_reviews([bool(v) for v in y[train][use]]) is None:
        cal = fit_review_calibration(got.out_of_fold[use], y[train][use])
        p = np.clip(cal.calibrator.transform(raw), 0.0, 1.0)
        out["refit_ece"] = float(expected_calibration_error(y[test], p))
        out["refit_balanced_accuracy"] = float(balanced_accuracy_score(y[test], p >= cal.threshold))
    return out


def _reviewed(data: CurveData, order: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which answers are reviewed (mask) and which of them were drawn at random."""
    ids = list(data.ids)
    where = {i: k for k, i in enumerate(ids)}
    perm = [where[i] for i in random_order(ids, f"{data.dataset}#{seed}")]
    chosen = np.zeros(len(ids), dtype=bool)
    drawn = np.zeros(len(ids), dtype=bool)
    if order == "random":
        chosen[perm[:n]] = True
        drawn[perm[:n]] = True
        return chosen, drawn
    first = perm[: min(FIRST_BATCH, n)]
    chosen[first] = True
    drawn[first] = True
    margin = np.abs(data.prob - data.threshold)
    rank = {k: r for r, k in enumerate(perm)}
    rest = sorted((k for k in range(len(ids)) if not chosen[k]), key=lambda k: (margin[k], rank[k]))
    chosen[rest[: n - len(first)]] = True
    return chosen, drawn


def simulate_point(data: CurveData, order: str, n: int, seed: int) -> dict[str, float] | None:
    """One simulated review of ``n`` answers: adapted and unadapted scores on the rest
    (``None`` when fewer than :data:`MIN_REST` answers would be left)."""
    if data.y.size - n < MIN_REST:
        return None
    chosen, drawn = _reviewed(data, order, n, seed)
    rest = ~chosen
    y = data.y
    calibrate = chosen & drawn
    if missing_reviews([bool(v) for v in y[calibrate]]) is None:
        cal = fit_review_calibration(data.raw[calibrate], y[calibrate])
        p = np.clip(cal.calibrator.transform(data.raw[rest]), 0.0, 1.0)
        thr, calibrated = cal.threshold, 1.0
    else:
        p, thr, calibrated = data.prob[rest], data.threshold, 0.0
    out = _scores(y[rest], p, thr)
    base = _scores(y[rest], data.prob[rest], data.threshold)
    out.update({f"unadapted_{k}": v for k, v in base.items()})
    out.update(_refit_scores(_stack_features(data), y, chosen, drawn, rest, dict(out)))
    out["calibrated"] = calibrated
    return out


def own_cv(data: CurveData, k: int = 5, seed: int = 0) -> dict[str, float]:
    """The same procedure with four fifths of the answers reviewed, out of fold (pooled
    over the folds): the ceiling the curves climb towards."""
    y = data.y
    p = np.full(y.size, np.nan)
    thr = np.full(y.size, np.nan)
    refit = np.full(y.size, np.nan)
    refit_thr = np.full(y.size, np.nan)
    x = _stack_features(data)
    folds = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    for train, test in folds.split(np.zeros(y.size), y):
        cal = fit_review_calibration(data.raw[train], y[train])
        p[test] = np.clip(cal.calibrator.transform(data.raw[test]), 0.0, 1.0)
        thr[test] = cal.threshold
        got = fit_refit(x[train], y[train], base=x[train, 0])
        if got.stacker is None or got.out_of_fold is None:  # not kept: calibration only
            refit[test], refit_thr[test] = p[test], thr[test]
            continue
        refit_cal = fit_review_calibration(got.out_of_fold, y[train])
        refit[test] = np.clip(
            refit_cal.calibrator.transform(got.stacker.predict_proba(x[test])), 0.0, 1.0
        )
        refit_thr[test] = refit_cal.threshold
    return {
        "ece": float(expected_calibration_error(y, p)),
        "balanced_accuracy": float(balanced_accuracy_score(y, p >= thr)),
        "auroc": float(roc_auc_score(y, p)),
        "refit_auroc": float(roc_auc_score(y, refit)),
        "refit_ece": float(expected_calibration_error(y, refit)),
        "refit_balanced_accuracy": float(balanced_accuracy_score(y, refit >= refit_thr)),
    }


@dataclass(frozen=True, kw_only=True)
class CurvePoint:
    """One ordering and number of reviews, over seeds: each metric's mean and 2.5/97.5
    percentiles (``adapted`` and ``unadapted`` on the same remaining answers)."""

    order: str
    n: int
    n_seeds: int
    n_rest: int
    calibrated_share: float
    adapted: Mapping[str, tuple[float, float, float]]
    unadapted: Mapping[str, tuple[float, float, float]]
    refit_share: float = math.nan
    """Share of the seeds whose refit was kept (NaN: a run from before the rule)."""


def _share(values: Sequence[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def _summary(values: Sequence[float]) -> tuple[float, float, float]:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    if not v.size:
        return (math.nan, math.nan, math.nan)
    return (float(v.mean()), float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5)))


def learning_curve(
    data: CurveData,
    *,
    sizes: Sequence[int] = SIZES,
    orders: Sequence[str] = ORDERS,
    seeds: int = SEEDS,
) -> list[CurvePoint]:
    """Every ordering and size of :func:`simulate_point`, summarised over ``seeds``."""
    points = []
    for order in orders:
        for n in sizes:
            runs = [r for s in range(seeds) if (r := simulate_point(data, order, n, s)) is not None]
            if not runs:
                continue
            points.append(
                CurvePoint(
                    order=order,
                    n=n,
                    n_seeds=len(runs),
                    n_rest=int(data.y.size - n),
                    calibrated_share=float(np.mean([r["calibrated"] for r in runs])),
                    refit_share=_share([r["refit_kept"] for r in runs]),
                    adapted={m: _summary([r[m] for r in runs]) for m in METRICS},
                    unadapted={
                        m: _summary([r[f"unadapted_{m}"] for r in runs]) for m in METRICS[:3]
                    },
                )
            )
    return points


@dataclass(frozen=True, kw_only=True)
class CurveRun:
    """A learning-curve run of one dataset, saved beside the other runs."""

    name: str
    created_at: str
    dataset: str
    judge: str
    set_name: str
    runs: tuple[str, ...]
    members: tuple[str, ...]
    n_answers: int
    n_hallucinated: int
    seeds: int
    points: tuple[CurvePoint, ...]
    own_cv: Mapping[str, float]
    kind: str = KIND
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [asdict(p) for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CurveRun:
        """A saved run, read as untrusted.

        Raises:
            DataError: Not a learning-curve run of this shape.
        """
        try:
            if d.get("kind") != KIND:
                raise DataError("not a review learning-curve run")
            points = tuple(
                CurvePoint(
                    order=str(p["order"]),
                    n=int(p["n"]),
                    n_seeds=int(p["n_seeds"]),
                    n_rest=int(p["n_rest"]),
                    calibrated_share=float(p["calibrated_share"]),
                    refit_share=float(p.get("refit_share", math.nan)),
                    adapted={
                        str(m): _triple(v) for m, v in dict(p["adapted"]).items() if m in METRICS
                    },
                    unadapted={
                        str(m): _triple(v) for m, v in dict(p["unadapted"]).items() if m in METRICS
                    },
                )
                for p in list(d["points"])[:200]
            )
            return cls(
                name=str(d["name"])[:200],
                created_at=str(d["created_at"])[:40],
                dataset=str(d["dataset"])[:200],
                judge=str(d["judge"])[:64],
                set_name=str(d["set_name"])[:64],
                runs=tuple(str(r)[:200] for r in list(d["runs"])[:20]),
                members=tuple(str(r)[:64] for r in list(d["members"])[:20]),
                n_answers=int(d["n_answers"]),
                n_hallucinated=int(d["n_hallucinated"]),
                seeds=int(d["seeds"]),
                points=points,
                own_cv={str(m): float(v) for m, v in dict(d["own_cv"]).items() if m in METRICS},
                notes=tuple(str(x)[:500] for x in list(d.get("notes", []))[:10]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"a malformed learning-curve run ({brief(e)})") from e

    @classmethod
    def load(cls, path: str | Path) -> CurveRun:
        return cls.from_dict(read_run(path, "learning-curve run"))

    def point(self, order: str, n: int) -> CurvePoint | None:
        return next((p for p in self.points if p.order == order and p.n == n), None)

    def to_markdown(self) -> str:
        def share(v: float) -> str:
            return f"{v:.0%}" if math.isfinite(v) else "-"

        def cell(v: tuple[float, float, float] | None) -> str:
            if v is None or not math.isfinite(v[0]):
                return "-"
            return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

        lines = [
            f"# Review learning curve: {self.dataset}",
            "",
            f"Base: the {self.set_name} set's {self.judge}, read out of fold from its "
            f"cross-validation run ({', '.join(self.runs)}); {self.n_answers} answers, "
            f"{self.n_hallucinated} hallucinated; {self.seeds} seeds; reviewers simulated "
            "by the gold labels. Scores on the answers not reviewed: mean [2.5%, 97.5%] "
            "over seeds.",
            "",
            "| order | reviews | calibrated | ECE | unadapted ECE | bal. acc. | unadapted bal. "
            "acc. | AUROC | refit kept | refit AUROC | refit ECE | refit bal. acc. |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in self.points:
            lines.append(
                f"| {p.order} | {p.n} | {p.calibrated_share:.0%} | {cell(p.adapted.get('ece'))} "
                f"| {cell(p.unadapted.get('ece'))} | {cell(p.adapted.get('balanced_accuracy'))} "
                f"| {cell(p.unadapted.get('balanced_accuracy'))} | {cell(p.adapted.get('auroc'))} "
                f"| {share(p.refit_share)} "
                f"| {cell(p.adapted.get('refit_auroc'))} | {cell(p.adapted.get('refit_ece'))} "
                f"| {cell(p.adapted.get('refit_balanced_accuracy'))} |"
            )
        own = self.own_cv
        lines += [
            "",
            f"Own 5-fold CV (four fifths reviewed): ECE {own.get('ece', math.nan):.3f}, balanced "
            f"accuracy {own.get('balanced_accuracy', math.nan):.3f}, AUROC "
            f"{own.get('auroc', math.nan):.3f}; refit AUROC {own.get('refit_auroc', math.nan):.3f}, "
            f"ECE {own.get('refit_ece', math.nan):.3f}, balanced accuracy "
            f"{own.get('refit_balanced_accuracy', math.nan):.3f}.",
            *(f"\n{n}" for n in self.notes),
        ]
        return "\n".join(lines)

    def save(self, folder: str | Path) -> tuple[Path, Path]:
        return save_run(self.name, self.to_dict(), self.to_markdown(), folder)


def _triple(v: object) -> tuple[float, float, float]:
    a, b, c = list(v)  # type: ignore[call-overload]  # untrusted: checked by the unpacking
    return (float(a), float(b), float(c))


def review_curve(
    data: CurveData,
    *,
    set_name: str,
    sizes: Sequence[int] = SIZES,
    orders: Sequence[str] = ORDERS,
    seeds: int = SEEDS,
) -> CurveRun:
    """The learning curves and both references of one dataset, as a run to save."""
    now = datetime.now(UTC)
    return CurveRun(
        name=f"{now:%Y%m%d-%H%M%S}-review-curve-{data.dataset}",
        created_at=now.isoformat(timespec="seconds"),
        dataset=data.dataset,
        judge=data.judge,
        set_name=set_name,
        runs=tuple(r for r in data.runs if r),
        members=tuple(data.members),
        n_answers=int(data.y.size),
        n_hallucinated=int(data.y.sum()),
        seeds=seeds,
        points=tuple(learning_curve(data, sizes=sizes, orders=orders, seeds=seeds)),
        own_cv=own_cv(data),
    )


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")
"""A run name an artifact may record (a file name in a runs folder, never a path)."""


def recorded_run(cfg: Mapping[str, Any], folders: Sequence[Path]) -> dict[str, Any]:
    """The cross-validation run an artifact's ``cfg.json`` records (``metrics.cv.run``),
    read from the first of ``folders`` that holds it.

    Raises:
        DataError: It records none, a name that is not a plain run name, or no folder
            holds it.
    """
    name = cfg_at(cfg, "metrics", "cv", "run")
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        raise DataError(
            f"the {cfg.get('detector')} artifact records no cross-validation run: train it "
            "with --cv to draw its learning curves"
        )
    for folder in folders:
        path = folder / f"{name}.json"
        if path.is_file():
            return read_run(path, "cross-validation run")
    raise DataError(f"no runs folder holds {name}.json (looked in {[str(f) for f in folders]})")


def set_curve_data(
    set_folder: Path, dataset: str, run_folders: Sequence[Path], judge: str = ANSWER_JUDGE
) -> CurveData:
    """:func:`curve_data` of a detector set's folder: its judge's recorded CV run and
    each other artifact's (the members) for the refit.

    Raises:
        DataError: The set has no judge artifact, or its run cannot be found or read.
    """
    cfgs: dict[str, dict[str, Any]] = {}
    for sub in sorted(p for p in set_folder.iterdir() if (p / "cfg.json").is_file()):
        cfgs[sub.name] = read_artifact_cfg(sub / "cfg.json")
    if judge not in cfgs:
        raise DataError(f"{set_folder} has no {judge} artifact to draw learning curves for")
    members = {}
    for name, cfg in cfgs.items():
        if name == judge:
            continue
        try:
            members[name] = recorded_run(cfg, run_folders)
        except DataError:
            continue  # a member without a run is left out of the refit
    return curve_data(recorded_run(cfgs[judge], run_folders), dataset, judge, members)
