"""Training a detector set from a recipe: ``train(recipe, out)``.

One loop behind ``ragscope train``, ``ragscope train --reproduce`` and the app's
background job (:mod:`core.services.jobs`): it reads the recipe's data, extracts features
through the feature cache, then either cross-validates (K folds, every answer scored out
of fold once, each fold checkpointed so an interrupted run resumes) and fits each
detector on all the answers, or fits on one train/validation/test split; each artifact
records the recipe and what it was trained on (:func:`core.evaluation.recipe.trained_on_record`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.base.paths import runs_dir, shipped_dir, shipped_runs_dir
from core.data import make_splits, resolve_datasets, stratified_head
from core.engine.model import LoadedModel, load_model
from core.evaluation.crossval import (
    CVOptions,
    CVProgress,
    cross_validate,
    default_maker,
    extract_all,
    fit_procedure,
)
from core.evaluation.cv_run import CVRun
from core.evaluation.evaluate import EvalOptions, EvalRun, Splits, evaluate
from core.evaluation.foldstore import folds_dir, prune_stale
from core.evaluation.recipe import TrainRecipe, trained_on_record
from core.evaluation.span_choice import recorded_rule
from core.pipeline.extract import Extraction, FeatureCache, Progress
from core.storage import Store

Prefetch = Callable[[LoadedModel, Sequence[RAGExample], Sequence[str]], None]
"""Fills the feature cache with ``(model, examples, detectors)`` before the run reads
it (the CLI's ``--engine ray`` / ``--batch-size``)."""


class TrainCancelled(BaseException):
    """Raised in :func:`train` when its ``cancel`` callback asks it to stop.

    A ``BaseException``, like ``KeyboardInterrupt``, so no ``except Exception`` on the
    way (a detector's fit, an example's extraction) swallows it.
    """


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """How a recipe is run (nothing here changes what it trains).

    Attributes:
        device: Where the model is loaded when :func:`train` loads it.
        bootstrap: Bootstrap resamples for the AUROC confidence intervals.
        use_cache: Read and write the feature cache (``False``: recompute every feature).
        name: The run's name (default: time + datasets).
        checkpoint: The fold checkpoints' folder (cross-validation; default: one per
            recipe and output folder, under :func:`core.evaluation.foldstore.folds_dir`).
        prefetch: Fills the feature cache first (:data:`Prefetch`).
        log: Where progress lines go (default: stderr).
    """

    device: str = "auto"
    bootstrap: int = 1000
    use_cache: bool = True
    name: str | None = None
    checkpoint: Path | None = None
    prefetch: Prefetch | None = None
    log: Callable[[str], None] = field(default=_stderr)


@dataclass(frozen=True, kw_only=True, eq=False)
class TrainResult:
    """A finished training run.

    Attributes:
        recipe: What was trained.
        out: The folder the artifacts were saved in (one subfolder per detector).
        run: Its evaluation: the cross-validation (``cv``) or the test split's run.
        artifacts: Detector name -> its artifact folder.
    """

    recipe: TrainRecipe
    out: Path
    run: EvalRun | CVRun
    artifacts: dict[str, Path]

    @property
    def auroc_from(self) -> str:
        """Where :meth:`auroc` comes from: ``"K-fold CV"`` or ``"test split"``."""
        return f"{self.run.k}-fold CV" if isinstance(self.run, CVRun) else "test split"

    def auroc(self) -> dict[str, float]:
        """Each trained detector's headline AUROC (those that have one)."""
        if isinstance(self.run, CVRun):
            got = {n: self.run.result(n).pooled.get("auroc") for n in self.artifacts}
        else:
            got = {r.detector: r.metrics.get("auroc") for r in self.run.results}
        return {n: float(a) for n, a in got.items() if isinstance(a, int | float)}

    def to_markdown(self) -> str:
        return self.run.to_markdown()


def recipe_examples(recipe: TrainRecipe) -> tuple[list[str], list[RAGExample]]:
    """The answers a cross-validated recipe reads: its datasets' names and the answers,
    combined (each keeps its dataset) and cut to about ``limit`` by whole sources.

    Raises:
        DataError: A dataset that cannot be read.
    """
    names, examples = resolve_datasets(recipe.dataset, on_error="skip")
    if recipe.limit:
        examples = stratified_head(examples, recipe.limit)
    return names, list(examples)


def recipe_splits(recipe: TrainRecipe) -> tuple[str, str | None, dict[str, list[RAGExample]]]:
    """The train/validation/test splits a one-split recipe reads (and their names).

    Raises:
        DataError: A dataset that cannot be read, or several combined (only with ``cv``).
    """
    if "," in recipe.dataset:
        raise DataError("several datasets combine only with --cv", field="dataset")
    return make_splits(recipe.dataset, recipe.test_dataset, limit=recipe.limit, seed=recipe.seed)


def checkpoint_folder(recipe: TrainRecipe, out: str | Path) -> Path:
    """Where cross-validated training of ``recipe`` into ``out`` checkpoints its folds: a
    rerun of the same recipe into the same folder resumes after the last fold scored."""
    key = json.dumps({"recipe": recipe.to_dict(), "out": str(Path(out).resolve())})
    return folds_dir() / f"train-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _checked(progress: Progress | None, cancel: Callable[[], bool] | None) -> Progress | None:
    if cancel is None:
        return progress

    def step(done: int, total: int) -> None:
        if cancel():
            raise TrainCancelled()
        if progress is not None:
            progress(done, total)

    return step


def cv_options(
    recipe: TrainRecipe, options: TrainOptions, *, checkpoint: Path | None = None
) -> CVOptions:
    """The cross-validation a ``cv`` recipe runs: its folds, seed, fit criterion and
    calibration from the recipe; the bootstrap, the run's name and where folds are
    checkpointed from the run's ``options``.

    Raises:
        DataError: The recipe has no ``cv``.
    """
    if recipe.cv is None:
        raise DataError("cross-validation needs a recipe with cv (--cv K)", field="cv")
    return CVOptions(
        k=recipe.cv,
        seed=recipe.seed,
        criterion=recipe.fit_criterion,
        calibrate_on=recipe.calibrate_on_names,
        calibration=recipe.fit_calibration,
        n_boot=options.bootstrap,
        name=options.name,
        checkpoint=checkpoint,
    )


def cross_validate_recipe(
    recipe: TrainRecipe,
    model: LoadedModel,
    *,
    options: TrainOptions | None = None,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    checkpoint: Path | None = None,
) -> tuple[CVRun, Extraction]:
    """The K-fold cross-validation of a ``cv`` recipe and the features it read (what
    ``ragscope evaluate --cv`` reports and :func:`train` fits after).

    Raises:
        DataError: The recipe has no ``cv``, or its data cannot be read.
    """
    opts = options or TrainOptions()
    if recipe.cv is None:
        raise DataError("cross-validation needs a recipe with cv (--cv K)", field="cv")
    sets, examples = recipe_examples(recipe)
    names = list(recipe.detectors)
    if opts.prefetch is not None:
        opts.prefetch(model, examples, names)
    make = default_maker(recipe.detector_options())
    with Store() as store:
        ext = extract_all(
            model,
            examples,
            names,
            make,
            cache=FeatureCache(store) if opts.use_cache else None,
            progress=_checked(progress, cancel),
        )
    for d in prune_stale():
        opts.log(f"removed the stale fold checkpoints {d}")
    run = cross_validate(
        model,
        names,
        examples,
        cv_options(recipe, opts, checkpoint=checkpoint or opts.checkpoint),
        datasets=sets,
        make=make,
        extraction=ext,
        progress=CVProgress(
            fold=lambda d, f, k: opts.log(f"{d}: fold {f + 1}/{k}"),
            resumed=lambda d, f, k: opts.log(
                f"{d}: fold {f + 1}/{k} read back from its checkpoint"
            ),
        ),
    )
    return run, ext


def _train_cv(
    recipe: TrainRecipe,
    out: Path,
    model: LoadedModel,
    opts: TrainOptions,
    progress: Progress | None,
    cancel: Callable[[], bool] | None,
) -> CVRun:
    folds = opts.checkpoint or checkpoint_folder(recipe, out)
    run, ext = cross_validate_recipe(
        recipe, model, options=opts, progress=progress, cancel=cancel, checkpoint=folds
    )
    make = default_maker(recipe.detector_options())
    exs = list(ext.examples)
    sets = sorted({e.provenance.dataset or "unknown" for e in exs})
    trained_on = trained_on_record(
        recipe,
        dataset=recipe.dataset,
        parts={d: [e for e in exs if e.provenance.dataset == d] for d in sets},
        fitted=exs,
        all_hash=run.data_hash,
    )
    for n in recipe.detectors:
        if cancel is not None and cancel():
            raise TrainCancelled()
        opts.log(f"{n}: final fit on all {len(exs)} answers")
        det = fit_procedure(
            make,
            n,
            list(ext.features[n]),
            exs,
            criterion=recipe.fit_criterion,
            calibrate_on=recipe.calibrate_on_names,
            calibration=recipe.fit_calibration,
            seed=recipe.seed,
        )
        r = run.result(n)
        if r.span_rule:
            det.span_rule_ = recorded_rule(r.span_rule, run.name, run.datasets)
        det.save(
            out / n,
            extra={
                "trained_on": trained_on,
                "threshold_criterion": recipe.fit_criterion,
                "token_threshold": det.token_threshold_,
                "metrics": {
                    "cv": {
                        "run": run.name,
                        "k": run.k,
                        "pooled": r.pooled,
                        "folds_auroc": dict(zip(("mean", "sd"), r.spread(), strict=True)),
                        "by_dataset": r.by_dataset,
                        "token": r.token,
                        "spans": r.spans,
                    }
                },
            },
        )
    shutil.rmtree(folds, ignore_errors=True)
    return run


def _train_split(
    recipe: TrainRecipe,
    out: Path,
    model: LoadedModel,
    opts: TrainOptions,
    progress: Progress | None,
    cancel: Callable[[], bool] | None,
) -> EvalRun:
    train_name, test_name, splits = recipe_splits(recipe)
    names = list(recipe.detectors)
    if opts.prefetch is not None:
        opts.prefetch(model, [e for p in ("train", "validation", "test") for e in splits[p]], names)
    with Store() as store:
        return evaluate(
            model,
            names,
            Splits.of(splits, train_name, test_name),
            EvalOptions(
                threshold_criterion=recipe.fit_criterion,
                n_boot=opts.bootstrap,
                name=opts.name,
                save_artifacts=out,
                recipe=recipe,
            ),
            configs=recipe.detector_options(),
            cache=FeatureCache(store) if opts.use_cache else None,
            progress=_checked(progress, cancel),
        )


def train(
    recipe: TrainRecipe,
    out: str | Path,
    *,
    model: LoadedModel | None = None,
    options: TrainOptions | None = None,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train ``recipe``'s detectors and save each artifact into ``out/<name>/``.

    Args:
        recipe: What to train.
        out: The artifact folder (an artifact already there is replaced).
        model: The loaded model (default: loaded from ``recipe.model`` on
            ``options.device``).
        options: How to run it (:class:`TrainOptions`).
        progress: ``(done, total)`` over the feature extraction.
        cancel: Asked at each example and before each final fit; ``True`` stops the run
            (:class:`TrainCancelled`).

    Raises:
        DataError: The recipe's data cannot be read or its detectors cannot train on it.
        ModelError: The model cannot be loaded.
        TrainCancelled: ``cancel`` asked to stop.
    """
    opts = options or TrainOptions()
    out = Path(out)
    if model is None:
        model = load_model(
            recipe.model,
            device=opts.device,
            progress=lambda msg, frac: opts.log(f"[{frac:4.0%}] {msg}"),
        )
    if cancel is not None and cancel():
        raise TrainCancelled()
    run: EvalRun | CVRun
    if recipe.cv is not None:
        run = _train_cv(recipe, out, model, opts, progress, cancel)
    else:
        run = _train_split(recipe, out, model, opts, progress, cancel)
    return TrainResult(
        recipe=recipe, out=out, run=run, artifacts={n: out / n for n in recipe.detectors}
    )


def cv_runs_dir(out: str | Path) -> Path:
    """Where a training run's cross-validation is saved: beside the shipped artifacts'
    runs when training the shipped set into its folder, else the user's runs folder."""
    return shipped_runs_dir() if Path(out).resolve() == shipped_dir().resolve() else runs_dir()


def report_training(result: TrainResult, out: str | Path) -> None:
    """Print what a training run made into ``out`` (its table, the artifacts) and save its
    cross-validation, if it ran one, in :func:`cv_runs_dir` (``ragscope train`` and a
    background job's worker alike)."""
    print(result.to_markdown())
    if isinstance(result.run, CVRun):
        j, m = result.run.save(cv_runs_dir(out))
        print(f"\nsaved the cross-validation as {j} and {m}")
    for n in result.recipe.detectors:
        print(f"saved {n} -> {Path(out) / n}")


def summary(result: TrainResult) -> dict[str, Any]:
    """What a finished job records: its headline AUROC, where it comes from, the run and
    (one split) where the features came from."""
    features: dict[str, Any] = {}
    if isinstance(result.run, EvalRun):
        ext = result.run.extraction
        features = {k: ext.get(k) for k in ("computed", "cache_hits", "n_errors", "seconds")}
    return {
        "auroc": result.auroc(),
        "auroc_from": result.auroc_from,
        "run": result.run.name,
        "features": features,
    }
