"""Cross-domain matrices: train on each dataset (and on all but one), test on each other.

:func:`domain_matrix` fits every detector with :func:`core.evaluation.crossval.fit_procedure` (the
same recipe as inside a cross-validation fold and for the shipped artifacts) on each
training set and scores each other dataset; the diagonal (``train == test``) is the
within-dataset cross-validation (:func:`core.evaluation.crossval.cross_validate`). Runs save as
JSON (+ markdown) and load back (:class:`MatrixRun`); :func:`core.evaluation.runs.load_run` reads a saved
run of any kind for the Benchmark page.

A full matrix over ~2,600 answers is hours of fitting on a CPU, so, like a
cross-validation, it resumes: with ``checkpoint`` each training's scores on its test
sets are saved (:mod:`core.evaluation.foldstore`, one file per training and test set, named by a
hash of the detector's config, the training and test answers, the options, the model
and the code) and a rerun reads them back instead of refitting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample, source_key
from core.data import data_hash
from core.engine.model import LoadedModel
from core.evaluation.crossval import (
    CVOptions,
    MakeDetector,
    cross_validate,
    default_maker,
    extract_all,
    ids_hash,
    label_array,
    pooled_metrics,
)
from core.evaluation.cv_run import CV_FORMAT, format_ci, read_run
from core.evaluation.evaluate import file_stem, save_run
from core.evaluation.foldstore import FoldResult, fold_key, fold_result, load_fold, save_fold
from core.learning.contract import Detector, Features
from core.pipeline.extract import Extraction, FeatureCache


@dataclass(frozen=True, kw_only=True)
class MatrixRun:
    """Cross-domain results: for each detector, AUROC of every (training, test) pair.

    ``cells[detector][train][test]`` holds n, positives, AUROC with its grouped CI,
    AP and balanced accuracy. ``train`` is a dataset name or ``"all but <test>"``; the
    diagonal (``train == test``) is the within-dataset cross-validation.
    """

    name: str
    created_at: str
    model: str
    datasets: tuple[str, ...]
    k: int
    seed: int
    cells: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]]
    kind: str = "matrix"
    format: int = CV_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MatrixRun:
        if d.get("kind") != "matrix" or d.get("format") != CV_FORMAT:
            raise DataError(f"not a matrix run of format {CV_FORMAT}; re-run it")
        kw = dict(d)
        kw["datasets"] = tuple(d["datasets"])
        cells = d["cells"]
        ok = isinstance(cells, dict) and all(
            isinstance(by_train, dict)
            and all(
                isinstance(by_test, dict) and all(isinstance(c, dict) for c in by_test.values())
                for by_test in by_train.values()
            )
            for by_train in cells.values()
        )
        if not ok or not kw["datasets"]:
            raise DataError(
                f"matrix run {kw.get('name')!r} is inconsistent: its cells must be detector -> "
                "training set -> test set -> metrics, over at least one dataset; re-run it"
            )
        return cls(**kw)

    def save(self, folder: str | Path) -> tuple[Path, Path]:
        return save_run(self.name, self.to_dict(), self.to_markdown(), folder)

    @classmethod
    def load(cls, path: str | Path) -> MatrixRun:
        return cls.from_dict(read_run(path, "matrix run"))

    def rows(self) -> list[str]:
        """Training rows in display order: each dataset, then each 'all but' row."""
        seen = {t for by_train in self.cells.values() for t in by_train}
        ordered = [d for d in self.datasets if d in seen]
        ordered += [f"all but {d}" for d in self.datasets if f"all but {d}" in seen]
        return ordered

    def frame(self, detector: str, metric: str = "auroc") -> Any:
        """A training x test table of ``metric`` for one detector."""
        import pandas as pd

        by_train = self.cells[detector]
        return pd.DataFrame(
            [
                [(by_train.get(tr, {}).get(te) or {}).get(metric) for te in self.datasets]
                for tr in self.rows()
            ],
            index=self.rows(),
            columns=list(self.datasets),
        )

    def to_markdown(self) -> str:
        lines = [
            f"# {self.name}",
            "",
            f"model `{self.model}`; AUROC [95% CI] by training set (rows) and test set "
            f"(columns); the diagonal is {self.k}-fold source-grouped cross-validation, "
            "'all but X' trains on every other set.",
        ]
        for det, by_train in self.cells.items():
            lines += ["", f"## {det}", "", "| train \\ test | " + " | ".join(self.datasets) + " |"]
            lines.append("|---|" + "---|" * len(self.datasets))
            for tr in self.rows():
                cells = [
                    format_ci(by_train.get(tr, {}).get(te) or {}, "auroc")
                    if by_train.get(tr, {}).get(te)
                    else ""
                    for te in self.datasets
                ]
                lines.append(f"| {tr} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _test_scores(det: Detector, feats: Sequence[Features], test: Sequence[int]) -> FoldResult:
    """``det``'s verdicts on the answers ``test`` (indices into ``feats``)."""
    vs = [det.predict(feats[i]) for i in test]
    return fold_result(np.asarray(test), vs, vs, float(det.threshold_), det.config.config_hash())


def _cell(res: FoldResult, exs: Sequence[RAGExample], n_boot: int, seed: int) -> dict[str, Any]:
    """The pooled metrics of one (training, test) pair from its test answers' scores."""
    test = [exs[i] for i in res.test]
    groups = np.asarray([source_key(e) for e in test])
    return pooled_metrics(label_array(test), res.scores, res.flagged, groups, n_boot, seed)


@dataclass(frozen=True)
class MatrixProgress:
    """What a cross-domain matrix reports as it goes (each optional).

    Attributes:
        extraction: ``(done, total)`` of the feature extraction.
        step: A line before each training and each diagonal cross-validation.
        resumed: A line for each training read back from the checkpoint.
    """

    extraction: Callable[[int, int], None] | None = None
    step: Callable[[str], None] | None = None
    resumed: Callable[[str], None] | None = None


def domain_matrix(
    model: LoadedModel,
    detectors: Sequence[str],
    datasets: Mapping[str, Sequence[RAGExample]],
    options: CVOptions | None = None,
    *,
    make: MakeDetector | None = None,
    cache: FeatureCache | None = None,
    leave_one_out: bool = True,
    diagonal: bool = True,
    progress: MatrixProgress | None = None,
) -> MatrixRun:
    """Train on each dataset (and, with ``leave_one_out``, on all but one), test on every
    other; the diagonal is :func:`cross_validate` within each dataset.

    Every fit is :func:`fit_procedure` on the training set alone (its threshold and
    calibration come from that set's validation part): what a user who trained on
    one domain would get on another.

    Args:
        options: How each training and the diagonal's cross-validation run
            (:class:`~core.evaluation.crossval.CVOptions`). Its ``checkpoint`` folder
            keeps each training's test scores, and a training already saved by the
            same run (same detector config, answers, options, model and code) is
            read instead of refitted; the diagonal's folds go there too. Its ``k`` is
            the diagonal's folds; ``name`` names the matrix.
        leave_one_out: Also train on all datasets but one, for each.
        diagonal: Cross-validate within each dataset.
        progress: What it reports as it goes (:class:`MatrixProgress`).
    """
    opts = options or CVOptions()
    report = progress or MatrixProgress()
    k, seed, checkpoint = opts.k, opts.seed, opts.checkpoint
    make = make or default_maker()
    if len(datasets) < 2:
        raise DataError("a cross-domain matrix needs at least two datasets")
    everything = [e for exs in datasets.values() for e in exs]
    ext = extract_all(model, everything, detectors, make, cache=cache, progress=report.extraction)
    kept = {e.id for e in ext.examples}
    index = {e.id: i for i, e in enumerate(ext.examples)}
    parts = {d: [index[e.id] for e in exs if e.id in kept] for d, exs in datasets.items()}
    cells: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in detectors}

    def subset(name: str, idx: Sequence[int]) -> tuple[list[Features], list[RAGExample]]:
        return [ext.features[name][i] for i in idx], [ext.examples[i] for i in idx]

    trainings = [(d, parts[d], [t for t in datasets if t != d]) for d in datasets]
    if leave_one_out and len(datasets) > 2:
        trainings += [
            (f"all but {t}", [i for d in datasets if d != t for i in parts[d]], [t])
            for t in datasets
        ]
    run_parts = {
        "kind": "matrix",
        "ids": ids_hash(ext.examples),
        "data": data_hash(ext.examples),
        "model": model.info.key,
        "criterion": opts.criterion,
        "calibration": opts.calibration,
        "calibrate_on": sorted(opts.calibrate_on) if opts.calibrate_on is not None else None,
        "val_share": opts.val_share,
        "seed": seed,
    }
    for n in detectors:
        config = make(n).config.config_hash()
        for train_name, idx, tests in trainings:
            keys = {
                t: fold_key(
                    {
                        **run_parts,
                        "detector": n,
                        "config": config,
                        "train": ids_hash([ext.examples[i] for i in idx]),
                        "test": t,
                    }
                )
                for t in tests
            }
            saved = {
                t: load_fold(checkpoint, keys[t], np.asarray(parts[t], dtype=np.int64))
                if checkpoint is not None
                else None
                for t in tests
            }
            if all(r is not None for r in saved.values()):
                if report.resumed is not None:
                    report.resumed(f"{n}: train on {train_name} (read back from its checkpoint)")
                results = {t: r for t, r in saved.items() if r is not None}
            else:
                if report.step is not None:
                    report.step(f"{n}: train on {train_name}")
                det = opts.fit(make, n, *subset(n, idx), seed)
                results = {t: _test_scores(det, ext.features[n], parts[t]) for t in tests}
                if checkpoint is not None:
                    for t, r in results.items():
                        save_fold(checkpoint, keys[t], r)
            for t, r in results.items():
                cells[n].setdefault(train_name, {})[t] = _cell(r, ext.examples, opts.n_boot, seed)
    if diagonal:
        for d in datasets:
            if report.step is not None:
                report.step(f"cross-validation within {d}")
            sub = Extraction(
                examples=tuple(ext.examples[i] for i in parts[d]),
                features={n: tuple(ext.features[n][i] for i in parts[d]) for n in detectors},
                errors=(),
                cache_hits=0,
                computed=0,
                seconds=0.0,
            )
            cv = cross_validate(
                model, detectors, sub.examples, replace(opts, name=None), make=make, extraction=sub
            )
            for res in cv.results:
                cells[res.detector].setdefault(d, {})[d] = dict(res.pooled)
    stamp = datetime.now(UTC)
    return MatrixRun(
        name=opts.name or file_stem(f"{stamp:%Y%m%d-%H%M%S}-matrix-{'+'.join(datasets)}"),
        created_at=stamp.isoformat(timespec="seconds"),
        model=model.info.key,
        datasets=tuple(datasets),
        k=k,
        seed=seed,
        cells=cells,
    )
