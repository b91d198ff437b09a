"""A detector set's cross-validated quality as it judges answers, experts included.

A set that defers the answers of a dataset to an expert (:mod:`core.pipeline.sets`) judges them
with the expert's detectors, so its quality on that dataset is the expert's, and its
pooled quality mixes both. This module puts the two cross-validations together, answer
by answer: each answer of the set's own run takes the expert's out-of-fold score and
flag where the set defers it (the same answers, read by both runs; checked), and the
set's own where it does not. Both runs' out-of-fold scores come from models that never
saw the answer, so the mix is as honest as either run.

The per-dataset and pooled numbers sit beside the set's own ("alone"), so a page or a
report shows what deferring changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import balanced_accuracy_score

from core.base.errors import DataError
from core.base.paths import shipped_runs_dir
from core.evaluation.cv_run import CVRun
from core.learning.calibration import match_dataset
from core.learning.metrics import auroc_or_none, evidence_warning, grouped_bootstrap_ci, is_binary
from core.pipeline.sets import ArtifactCard, DetectorSet


@dataclass(frozen=True, kw_only=True)
class PartQuality:
    """One dataset's answers, judged as the set judges them.

    Attributes:
        dataset: The dataset (as the set's CV run names it).
        judged_by: The set whose detector judges its answers (the set's, or its expert's).
        n: Answers; n_positive: hallucinated ones.
        auroc: Out-of-fold AUROC of the judging set's scores; auroc_ci: its 95% interval
            (source-grouped bootstrap).
        balanced_accuracy: Of the out-of-fold flags (each at its fold's threshold).
        alone_auroc: The set's own out-of-fold AUROC on these answers, without experts.
        alone_balanced_accuracy: The same for its flags.
        evidence: Why these answers are too few to read as a fact (``None``: enough).
    """

    dataset: str
    judged_by: str
    n: int
    n_positive: int
    auroc: float | None
    auroc_ci: list[float] | None
    balanced_accuracy: float | None
    alone_auroc: float | None
    alone_balanced_accuracy: float | None
    evidence: str | None


@dataclass(frozen=True, kw_only=True)
class SetQuality:
    """A detector of a set, cross-validated as the set judges answers with its experts.

    Attributes:
        detector: The detector (the set's answer judge by default).
        set_name: The set.
        runs: Set name -> the CV run its numbers come from.
        parts: Each dataset of the set's run, in its order.
        pooled: Over every answer: ``n``, ``n_positive``, ``auroc``, ``auroc_ci``,
            ``balanced_accuracy``.
        alone: The same, the set without its experts.
        measured_on: What the numbers were measured on, in words (the cross-validation,
            its answers and datasets, and the runs).
    """

    detector: str
    set_name: str
    runs: Mapping[str, str]
    parts: tuple[PartQuality, ...]
    pooled: Mapping[str, Any]
    alone: Mapping[str, Any]
    measured_on: str = ""

    @property
    def deferred(self) -> bool:
        """Whether some dataset is judged by an expert (else "alone" repeats the rest)."""
        return len(self.runs) > 1

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per dataset, then ``all``: what a table shows."""
        rows = [
            {
                "dataset": p.dataset,
                "judged by": p.judged_by,
                "answers": p.n,
                "hallucinated": p.n_positive,
                "AUROC": p.auroc,
                "AUROC low": p.auroc_ci[0] if p.auroc_ci else None,
                "AUROC high": p.auroc_ci[1] if p.auroc_ci else None,
                "balanced accuracy": p.balanced_accuracy,
                "set alone AUROC": p.alone_auroc,
                "set alone balanced accuracy": p.alone_balanced_accuracy,
            }
            for p in self.parts
        ]
        ci = self.pooled.get("auroc_ci")
        rows.append(
            {
                "dataset": "all",
                "judged by": " + ".join(dict.fromkeys(p.judged_by for p in self.parts)),
                "answers": self.pooled["n"],
                "hallucinated": self.pooled["n_positive"],
                "AUROC": self.pooled["auroc"],
                "AUROC low": ci[0] if ci else None,
                "AUROC high": ci[1] if ci else None,
                "balanced accuracy": self.pooled["balanced_accuracy"],
                "set alone AUROC": self.alone["auroc"],
                "set alone balanced accuracy": self.alone["balanced_accuracy"],
            }
        )
        return rows


def _balanced(y: np.ndarray, flags: np.ndarray) -> float | None:
    """Balanced accuracy of ``flags``; ``None`` without both classes."""
    return float(balanced_accuracy_score(y, flags)) if is_binary(y) else None


def _summary(
    y: np.ndarray, s: np.ndarray, flags: np.ndarray, groups: np.ndarray, n_boot: int
) -> dict[str, Any]:
    return {
        "n": int(y.size),
        "n_positive": int(y.sum()),
        "auroc": auroc_or_none(y, s),
        "auroc_ci": grouped_bootstrap_ci(y, s, groups, n_boot=n_boot),
        "balanced_accuracy": _balanced(y, flags),
    }


def deferred_quality(
    own: CVRun,
    experts: Mapping[str, tuple[str, CVRun]],
    detector: str,
    *,
    set_name: str,
    n_boot: int = 1000,
) -> SetQuality:
    """``detector``'s out-of-fold quality as the set judges answers: each answer of
    ``own`` (the set's CV run) by its dataset's expert where ``experts`` has one
    (:func:`core.learning.calibration.match_dataset`), else by the set.

    Args:
        own: The set's CV run (every dataset it was trained on).
        experts: Training dataset -> ``(expert set name, the expert's CV run)``.
        detector: A detector both runs report.
        set_name: The set's name.

    Raises:
        DataError: A run lacks the detector, or an expert's run did not read an answer
            the set defers to it (or labels it otherwise): the runs must read the same
            answers.
    """
    mine = own.result(detector)
    y = np.asarray(own.labels, dtype=int)
    alone = np.asarray(mine.scores, dtype=np.float64)
    alone_flags = np.asarray(mine.flagged, dtype=bool)
    scores, flags = alone.copy(), alone_flags.copy()
    judged_by = [set_name] * len(y)
    index = {ds: {i: k for k, i in enumerate(run.ids)} for ds, (_, run) in experts.items()}
    results = {ds: run.result(detector) for ds, (_, run) in experts.items()}
    for k, (answer, ds) in enumerate(zip(own.ids, own.example_datasets, strict=True)):
        found = match_dataset(experts, ds)
        if found is None:
            continue
        trained, (name, run) = found
        j = index[trained].get(answer)
        if j is None or run.labels[j] != y[k]:
            raise DataError(
                f"the {name} set's CV run {run.name} did not read answer {answer!r} of {ds} "
                f"as the {set_name} set's run {own.name} did: cross-validate both on the "
                "same answers"
            )
        scores[k], flags[k] = results[trained].scores[j], results[trained].flagged[j]
        judged_by[k] = name
    groups = np.asarray(own.groups if own.groups else own.ids)
    datasets = np.asarray(own.example_datasets)
    parts = []
    for ds in dict.fromkeys(own.example_datasets):
        m = datasets == ds
        part = _summary(y[m], scores[m], flags[m], groups[m], n_boot)
        parts.append(
            PartQuality(
                dataset=ds,
                judged_by=judged_by[int(np.flatnonzero(m)[0])],
                n=part["n"],
                n_positive=part["n_positive"],
                auroc=part["auroc"],
                auroc_ci=part["auroc_ci"],
                balanced_accuracy=part["balanced_accuracy"],
                alone_auroc=auroc_or_none(y[m], alone[m]),
                alone_balanced_accuracy=_balanced(y[m], alone_flags[m]),
                evidence=evidence_warning(y[m], f"The {ds} answers"),
            )
        )
    runs = {set_name: own.name, **{name: run.name for name, run in experts.values()}}
    ks = sorted({own.k, *(run.k for _, run in experts.values())})
    measured_on = (
        f"{'/'.join(map(str, ks))}-fold source-grouped cross-validation, each answer scored "
        f"out of fold: {y.size:,} answers ({int(y.sum()):,} hallucinated) of "
        f"{', '.join(own.datasets)}; runs " + ", ".join(f"{r} ({n})" for n, r in runs.items())
    )
    return SetQuality(
        measured_on=measured_on,
        detector=detector,
        set_name=set_name,
        runs=runs,
        parts=tuple(parts),
        pooled=_summary(y, scores, flags, groups, n_boot),
        alone=_summary(y, alone, alone_flags, groups, n_boot),
    )


def _card_run(card: ArtifactCard, runs: Path) -> CVRun:
    """The CV run ``card`` records its numbers from, read from ``runs``.

    Raises:
        DataError: The card names no run, or it is not there or not readable.
    """
    name = card.cv_run
    if name is None:
        raise DataError(f"the {card.name} artifact in {card.folder} records no CV run")
    return CVRun.load(runs / f"{name}.json")


def set_quality(
    dset: DetectorSet,
    detector: str | None = None,
    *,
    runs: Path | None = None,
    n_boot: int = 1000,
) -> SetQuality:
    """The set's CV quality with its experts (:func:`deferred_quality`) for ``detector``
    (default: its answer judge), from the runs its cards record (in ``runs``, default
    the shipped runs): the numbers that describe the loaded set. A set without experts
    gets its own run's, every answer judged by it.

    Raises:
        DataError: The set or an expert lacks the detector, its card records no CV run,
            or a run is missing or does not read the same answers.
    """
    name = detector or dset.judge_name
    if name is None:
        raise DataError(f"the {dset.name} set has no answer judge; name a detector")
    folder = runs or shipped_runs_dir()
    experts = {ds: (e.name, _card_run(e.card(name), folder)) for ds, e in dset.experts.items()}
    own = _card_run(dset.card(name), folder)
    return deferred_quality(own, experts, name, set_name=dset.name, n_boot=n_boot)
