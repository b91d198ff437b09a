"""Fitting detectors: ``evaluate`` (fit on train, or load artifacts; threshold on
validation; report on test) and ``train`` (fit and save the artifacts, or with
``--reproduce`` rebuild saved ones from their recorded recipe and compare).

``train`` parses its options into a :class:`core.evaluation.recipe.TrainRecipe` and runs it through
:func:`core.evaluation.train.train`, as ``--reproduce`` does with each recorded recipe and ``--job``
with the recipe a background job's row stores."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.base.errors import DataError
from core.base.examples import RAGExample, Span
from core.base.paths import DEFAULT_SET, detector_set_dir, runs_dir, shipped_dir, shipped_runs_dir
from core.cli.common import (
    Subparsers,
    add_detector_option_args,
    add_engine_args,
    add_model_args,
    detector_options,
    eval_splits,
    help_epilog,
    import_feature_stores,
    load,
    prefetch_features,
    recipe_dataset,
    recipe_model,
    tqdm_progress,
)
from core.data import resolve_datasets, stratified_head
from core.detectors import available_detectors, shipped_artifacts
from core.engine.model import LoadedModel
from core.evaluation.attribution_check import KIND as ATTRIBUTION_KIND
from core.evaluation.attribution_check import (
    AblationRow,
    attribution_markdown,
    attribution_report,
    attribution_run,
    check_rows,
    save_attribution_run,
)
from core.evaluation.crossval import CVOptions, default_maker
from core.evaluation.cv_run import CALIBRATIONS, Calibration, CVRun
from core.evaluation.evaluate import EvalOptions, Splits, evaluate
from core.evaluation.evidence_quality import KIND as EVIDENCE_KIND
from core.evaluation.evidence_quality import (
    evidence_markdown,
    evidence_quality,
    evidence_run,
    save_evidence_run,
)
from core.evaluation.foldstore import folds_dir, prune_stale
from core.evaluation.matrix import MatrixProgress, MatrixRun, domain_matrix
from core.evaluation.recipe import TrainRecipe
from core.evaluation.review_curve import SEEDS, review_curve, set_curve_data
from core.evaluation.runs import load_run
from core.evaluation.train import (
    Prefetch,
    TrainOptions,
    cross_validate_recipe,
    report_training,
    train,
)
from core.learning.artifact import artifact_info, compare_artifacts
from core.pipeline.extract import FeatureCache
from core.pipeline.sets import ANSWER_JUDGE, TrainedOn, folder_set
from core.services.worker import run_train_job
from core.signals.smoothing import P_STAY_TOKEN
from core.storage import Store


def _fit_parser(
    sub: Subparsers, cmd: str, helptext: str, examples: Sequence[tuple[str, str]]
) -> argparse.ArgumentParser:
    """The parser of ``evaluate`` or ``train`` with the options they share, its
    ``--help`` ending in ``examples`` and the detector names."""
    p = sub.add_parser(
        cmd,
        help=helptext,
        description=helptext,
        epilog=help_epilog(examples, available_detectors()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument(
        "--dataset",
        default="builtin",
        help="demo, builtin, shared:NAME (a set in ../shared/data), a file/folder or a stored "
        "name; with --cv, several comma-separated (combined, each keeping its name)",
    )
    p.add_argument("--test-dataset", default=None, help="cross-dataset: test on all of this one")
    p.add_argument(
        "--features",
        action="append",
        default=[],
        metavar="DIR",
        help="a feature store (Parquet shards from `ragscope extract --out DIR`, repeatable): "
        "merged into the local feature cache first, so its examples are not traced again",
    )
    p.add_argument(
        "--cv",
        type=int,
        nargs="?",
        const=5,
        default=None,
        metavar="K",
        help="K-fold source-grouped cross-validation (default K: 5) instead of one split: "
        "every answer scored out of fold once, pooled metrics with grouped bootstrap CIs, the "
        "fold spread, calibration (ECE) and per-generator/per-dataset breakdowns; resumable: "
        "each fold is saved once scored (under the cache's cv-folds/), so rerunning an "
        "interrupted command refits only the folds it had not finished",
    )
    p.add_argument(
        "--calibrate-on",
        default=None,
        metavar="NAMES",
        help="with --cv: fit calibration and thresholds on the validation answers of these "
        "datasets only (comma-separated dataset names; default: all)",
    )
    p.add_argument(
        "--calibration",
        choices=CALIBRATIONS,
        default=None,
        help="with --cv/--matrix: fit each calibrator and threshold on cross-fitted scores of "
        "all training answers (crossfit, the default) or on the validation part only (split)",
    )
    p.add_argument(
        "--criterion",
        choices=("balanced_accuracy", "f1"),
        default=None,
        help="what the answer threshold maximises on validation (default: f1; with --cv: "
        "balanced_accuracy)",
    )
    p.add_argument("--detectors", default="nll,context_gain,lexical", help="comma-separated names")
    p.add_argument(
        "--limit", type=int, default=None, help="use about this many examples (whole sources)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="split seed (datasets without their own split)"
    )
    p.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap resamples for the AUROC CI"
    )
    add_detector_option_args(p)
    add_engine_args(p)
    return p


def _add_evaluate(sub: Subparsers) -> None:
    p = _fit_parser(
        sub,
        "evaluate",
        "fit on the train split (or load artifacts), threshold on validation, report on test",
        [
            (
                "ragscope evaluate --dataset demo --detectors nll,lexical",
                "fit two cheap detectors on the 12 demo answers and report on their test split",
            ),
            (
                "ragscope evaluate --dataset builtin --limit 200 --cv 5 --detectors saplma,lexical",
                "5-fold cross-validation on 200 built-in answers, with 95% CIs",
            ),
            (
                "ragscope evaluate --dataset demo --artifacts assets/detectors --as-trained "
                "--detectors ensemble,saplma",
                "judge the demo answers (none trained on) with the shipped set as it was trained",
            ),
        ],
    )
    p.add_argument(
        "--artifacts",
        default=None,
        help="load detectors from this folder instead of training",
    )
    p.add_argument(
        "--as-trained",
        action="store_true",
        help="with --artifacts: judge every answer of --dataset (or of --test-dataset) "
        "with the detectors exactly as trained, at their own calibration and thresholds "
        "(each dataset's own where they have one), an answer of a dataset the folder's "
        "experts.json has an expert for by that expert, as `ragscope judge` does; no "
        "validation part re-picks them",
    )
    p.add_argument(
        "--matrix",
        default=None,
        metavar="SPECS",
        help="cross-domain matrix over these comma-separated datasets: train on each (and on "
        "all but each), test on every other; the diagonal is --cv K cross-validation",
    )
    p.add_argument(
        "--no-diagonal",
        action="store_true",
        help="with --matrix: leave the diagonal (each set's own CV) out, only the "
        "cross-set cells (the costly part on a CPU; `--cv` runs give the diagonal)",
    )
    p.add_argument(
        "--review-curve",
        default=None,
        metavar="DATASET",
        help="learning curves of the review loop on a labelled dataset the set's CV run "
        "holds (e.g. dolly_ac_dev): reviewers simulated by its gold labels, the set (from "
        "--artifacts, default the default set) adapted after 10-200 reviews in random and "
        "uncertainty order, scored on the answers not reviewed; reads the recorded CV runs "
        "(no answer is traced)",
    )
    p.add_argument(
        "--seeds", type=int, default=SEEDS, help="with --review-curve: random draws per point"
    )
    p.add_argument(
        "--evidence",
        default=None,
        metavar="DATASET",
        help="how well each gold span's evidence (the passage sentence it relies on) and type "
        "(unsupported or contradicted) are found from the text alone, on a labelled dataset "
        "whose span notes quote the passages (e.g. shared:ragtruth_qa_dev); loads no model; "
        "saved under the runs folder's evidence/",
    )
    p.add_argument(
        "--attribution",
        default=None,
        metavar="DATASET",
        help="is the attention-based context attribution faithful? For up to 3 sentences of "
        "each answer, removing the passage sentence they attend to most is compared with "
        "removing a random one of the same length (and the text alignment's sentence), by "
        "the drop in the sentence's log-probability (docs/attribution.md); resumable (a "
        "progress file beside the runs), saved under the runs folder's attribution/",
    )
    p.add_argument(
        "--flagged-by",
        default=None,
        metavar="RUN[:DETECTOR]",
        help="with --evidence: only the gold spans a CV run's chosen span rule flagged out of "
        "fold (its detector's, default the ensemble's), the spans a reviewer would see",
    )
    p.add_argument("--no-cache", action="store_true", help="recompute features (ignore the cache)")
    p.add_argument("--name", default=None, help="run name (default: time + datasets)")
    p.add_argument("--out", default=None, help="folder for the run's JSON and markdown")
    p.add_argument(
        "--smooth",
        type=float,
        default=None,
        metavar="P_STAY",
        help="also report token metrics after label-persistence smoothing of every "
        f"detector's token scores (CORTEX uses {P_STAY_TOKEN})",
    )
    p.set_defaults(func=cmd_evaluate)


def _calibration(args: argparse.Namespace) -> Calibration:
    return getattr(args, "calibration", None) or "crossfit"


def _combined(args: argparse.Namespace, specs: str) -> tuple[list[str], list[Any]]:
    names, examples = resolve_datasets(specs, on_error="skip")
    if args.limit:
        examples = stratified_head(examples, args.limit)
    return names, examples


def _prefetch(args: argparse.Namespace) -> Prefetch:
    """``--engine ray`` / ``--batch-size``: fill the feature cache before a run reads it."""

    def fill(model: LoadedModel, examples: Sequence[RAGExample], names: Sequence[str]) -> None:
        prefetch_features(args, model, examples, names)

    return fill


def _run_options(args: argparse.Namespace, checkpoint: Path | None = None) -> TrainOptions:
    """How this command line runs a recipe (device, bootstrap, cache, run name)."""
    return TrainOptions(
        device=args.device,
        bootstrap=args.bootstrap,
        use_cache=not getattr(args, "no_cache", False),
        name=getattr(args, "name", None),
        checkpoint=checkpoint,
        prefetch=_prefetch(args),
    )


def _folds_folder(args: argparse.Namespace) -> Path:
    """This command line's fold checkpoints (:mod:`core.evaluation.foldstore`): a rerun of the
    same command after an interruption resumes after the last fold scored; removed
    once the command has saved what it makes (:func:`_clear_folds`)."""
    plain = {k: v for k, v in sorted(vars(args).items()) if not callable(v)}
    tag = hashlib.sha256(json.dumps(plain, default=str).encode()).hexdigest()[:16]
    return folds_dir() / tag


def _checkpoints(args: argparse.Namespace) -> Path:
    """:func:`_folds_folder`, once stale checkpoints of other commands are pruned (a
    command that starts checkpointing cleans up after those stopped and never rerun)."""
    for d in prune_stale():
        print(f"removed the stale fold checkpoints {d}", file=sys.stderr)
    return _folds_folder(args)


def _clear_folds(args: argparse.Namespace) -> None:
    shutil.rmtree(_folds_folder(args), ignore_errors=True)


def _matrix(args: argparse.Namespace, names: list[str], model: LoadedModel) -> MatrixRun:
    parts = {}
    for spec in [x.strip() for x in args.matrix.split(",") if x.strip()]:
        (name,), examples = _combined(args, spec)
        parts[name] = examples
    prefetch_features(args, model, [e for exs in parts.values() for e in exs], names)
    with Store() as store:
        return domain_matrix(
            model,
            names,
            parts,
            CVOptions(
                k=args.cv or 5,
                seed=args.seed,
                criterion=args.criterion or "balanced_accuracy",
                calibration=_calibration(args),
                n_boot=args.bootstrap,
                name=args.name,
                checkpoint=_checkpoints(args),
            ),
            make=default_maker(detector_options(args)),
            cache=None if args.no_cache else FeatureCache(store),
            diagonal=not args.no_diagonal,
            progress=MatrixProgress(
                extraction=tqdm_progress("features"),
                step=lambda msg: print(msg, file=sys.stderr),
                resumed=lambda msg: print(msg, file=sys.stderr),
            ),
        )


def _merge_feature_stores(args: argparse.Namespace) -> None:
    """``--features DIR``: merge each store into the local cache (summary on stderr)."""
    for line in import_feature_stores(getattr(args, "features", None) or []):
        print(line, file=sys.stderr)


def _review_curve(args: argparse.Namespace) -> int:
    """``evaluate --review-curve DATASET``: the learning curves from the set's recorded
    CV runs (:mod:`core.evaluation.review_curve`), printed and saved."""
    if not 1 <= args.seeds <= 200:
        raise DataError("--seeds must be from 1 to 200", field="seeds")
    folder = Path(args.artifacts) if args.artifacts else detector_set_dir(DEFAULT_SET)
    dataset = args.review_curve.removeprefix("shared:").removesuffix(".jsonl")
    data = set_curve_data(folder, dataset, [runs_dir(), shipped_runs_dir()])
    name = (
        DEFAULT_SET if folder.resolve() == detector_set_dir(DEFAULT_SET).resolve() else folder.name
    )
    run = review_curve(data, set_name=name, seeds=args.seeds)
    j, m = run.save(args.out or runs_dir())
    print(run.to_markdown())
    print(f"\nsaved {j} and {m}")
    return 0


def _flagged_by(spec: str) -> Callable[[RAGExample, Span], bool]:
    """Keeps the gold spans a CV run's span rule flagged out of fold (``RUN[:DETECTOR]``)."""
    path, _, name = spec.partition(":")
    run = load_run(path)
    if not isinstance(run, CVRun):
        raise DataError("not a cross-validation run", source=path, field="flagged-by")
    judge = name or ANSWER_JUDGE
    r = next((r for r in run.results if r.detector == judge), None)
    hits = (r.span_rule or {}).get("hits") if r is not None else None
    if not isinstance(hits, list):
        raise DataError(
            f"the run records no flagged gold spans for {judge!r} (a run saved "
            "before span rules, or a detector without token scores)",
            source=path,
            field="flagged-by",
        )
    keep = {
        (h[0], h[1], h[2])
        for h in hits
        if isinstance(h, list) and len(h) == 3 and type(h[1]) is int and type(h[2]) is int
    }
    return lambda ex, span: (ex.id, span.start, span.end) in keep


def _evidence(args: argparse.Namespace) -> int:
    """``evaluate --evidence DATASET``: evidence hit rate and span-type balanced accuracy
    (:mod:`core.evaluation.evidence_quality`), printed and saved; no model is loaded."""
    names, examples = _combined(args, args.evidence)
    only = _flagged_by(args.flagged_by) if args.flagged_by else None
    report = evidence_quality(
        tqdm(examples, desc="evidence", unit="answer", file=sys.stderr),
        only=only,
        n_boot=args.bootstrap,
    )
    if args.flagged_by:
        report = {**report, "flagged_by": args.flagged_by}
    run = evidence_run(report, "+".join(names))
    j, m = save_evidence_run(run, args.out or runs_dir() / EVIDENCE_KIND)
    print(evidence_markdown(run))
    print(f"\nsaved {j} and {m}")
    return 0


def _attribution(args: argparse.Namespace) -> int:
    """``evaluate --attribution DATASET``: the ContextCite-style ablation check of the
    attention attribution (:mod:`core.evaluation.attribution_check`), printed and saved."""
    names, examples = _combined(args, args.attribution)
    model = load(args)
    folder = Path(args.out) if args.out else runs_dir() / ATTRIBUTION_KIND
    tag = hashlib.sha256(f"{'+'.join(names)}|{model.info.key}|{args.seed}".encode()).hexdigest()
    progress = folder / "progress" / f"{tag[:16]}.jsonl"
    rows: list[AblationRow] = []
    reused = 0
    bar = tqdm(total=len(examples), desc="attribution", unit="answer", file=sys.stderr)
    failed: list[str] = []
    for ex, got, computed, error in check_rows(model, examples, seed=args.seed, progress=progress):
        rows += got
        reused += not computed
        if error is not None:
            failed.append(f"{ex.id}: {error}")
        bar.update()
        bar.set_postfix(spans=len(rows), reused=reused, failed=len(failed))
    bar.close()
    for line in failed[:10]:
        print(f"SKIPPED {line}", file=sys.stderr)
    report = attribution_report(rows, n_boot=args.bootstrap, seed=args.seed)
    report["n_failed"] = len(failed)
    run = attribution_run(report, "+".join(names), model.info.display_name)
    j, m = save_attribution_run(run, folder)
    print(attribution_markdown(run))
    print(f"\nsaved {j} and {m} (progress: {progress})")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.attribution:
        return _attribution(args)
    if args.review_curve:
        return _review_curve(args)
    if args.evidence:
        return _evidence(args)
    _merge_feature_stores(args)
    names = [d for d in args.detectors.split(",") if d]
    if args.matrix or args.cv:
        if args.artifacts or args.test_dataset or args.smooth is not None:
            raise DataError(
                "--cv and --matrix fit their own detectors on every dataset; leave out "
                "--artifacts, --test-dataset and --smooth"
            )
        model = load(args)
        run: Any = (
            _matrix(args, names, model)
            if args.matrix
            else cross_validate_recipe(
                TrainRecipe.from_args(args),
                model,
                options=_run_options(args, _checkpoints(args)),
                progress=tqdm_progress("features"),
            )[0]
        )
        j, m = run.save(args.out or runs_dir())
        _clear_folds(args)
        print(run.to_markdown())
        print(f"\nsaved {j} and {m}")
        return 0
    if "," in args.dataset:
        raise DataError("several datasets combine only with --cv (or --matrix)", field="dataset")
    if args.as_trained and not args.artifacts:
        raise DataError(
            "--as-trained judges with trained detectors: give their folder with --artifacts "
            "(e.g. --artifacts assets/detectors)"
        )
    train_name, test_name, splits = eval_splits(args)
    if args.as_trained:
        # Every answer is test data; the artifacts' own thresholds stay.
        judged = splits["test"] if args.test_dataset else [e for p in splits.values() for e in p]
        splits = {"train": [], "validation": [], "test": judged}
    model = load(args)
    artifacts = {}
    experts: dict[str, dict[str, Any]] = {}
    loaded: dict[str, Any] = {}
    if args.artifacts:
        artifacts = {n: Path(args.artifacts) / n for n in names}
    if args.as_trained:
        loaded, experts = _as_trained_set(model, Path(args.artifacts), names, splits["test"])
    parts = ("validation", "test") if artifacts else ("train", "validation", "test")
    prefetch_features(args, model, [e for p in parts for e in splits[p]], names)
    with Store() as store:
        run = evaluate(
            model,
            names,
            Splits.of(
                {**splits, "train": [] if artifacts else splits["train"]}, train_name, test_name
            ),
            EvalOptions(
                threshold_criterion=args.criterion or "f1",
                n_boot=args.bootstrap,
                name=args.name,
                smooth=args.smooth,
            ),
            artifacts=artifacts,
            loaded=loaded,
            configs=detector_options(args),
            experts=experts,
            cache=None if args.no_cache else FeatureCache(store),
            progress=tqdm_progress("features"),
        )
    j, m = run.save(args.out or runs_dir())
    print(run.to_markdown())
    print(f"\nsaved {j} and {m}")
    return 0


def _as_trained_set(
    model: LoadedModel, folder: Path, names: list[str], judged: list[RAGExample]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The set in ``folder`` (:func:`core.pipeline.sets.folder_set`), loaded once: its
    detectors of ``names`` and its experts by training dataset, each as its detectors of
    ``names``; says on stderr which of the ``judged`` answers each expert judges, and
    why a named expert is not used."""
    dset = folder_set(model.info.key, folder)
    own = {n: dset.card(n).detector for n in names if n in dset.names}
    for problem in dset.expert_problems:
        print(f"expert not used: {problem}", file=sys.stderr)
    out: dict[str, dict[str, Any]] = {}
    for ds, expert in dset.experts.items():
        out[ds] = {n: expert.card(n).detector for n in names if n in expert.names}
        n = sum(dset.for_example(e) is expert for e in judged)
        print(
            f"{n} of {len(judged)} answers ({ds} or another split of it) judged by the "
            f"{expert.name} set, the {dset.name} set's expert",
            file=sys.stderr,
        )
    return own, out


def _add_train(sub: Subparsers) -> None:
    p = _fit_parser(
        sub,
        "train",
        "train detectors and save their artifacts (reproduces assets/detectors)",
        [
            (
                "ragscope train --dataset demo --detectors nll,lexical --out /tmp/my-set",
                "a small set to try the app with (RAGSCOPE_DETECTORS_DIR=/tmp/my-set make app)",
            ),
            (
                "ragscope train --dataset builtin,shared:ragtruth_qa_dev --cv 5 "
                "--detectors saplma,lexical --out /tmp/cv-set",
                "cross-validated training on two sets (each keeps its own calibration)",
            ),
            ("ragscope train --reproduce", "rebuild the shipped artifacts from their recipes"),
        ],
    )
    p.add_argument(
        "--out",
        default=None,
        help="artifact folder, one subfolder each (default: assets/detectors; "
        "with --reproduce: a temporary folder)",
    )
    p.add_argument(
        "--job",
        type=int,
        default=None,
        metavar="ID",
        help="run as background job ID (the app queues these, and starts this command for "
        "them): trains the recipe the job's row stores (the other training options are not "
        "read), with progress and a heartbeat in the database, stops when cancelled there, "
        "and publishes the artifacts into --out only once all are trained",
    )
    p.add_argument(
        "--reproduce",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="rebuild every artifact in DIR (default: the shipped ones) from the "
        "recipe it records, and check the rebuild matches; exit 1 if not",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    if args.reproduce is not None:
        if args.job is not None:
            raise DataError("--job trains; it does not combine with --reproduce")
        return _reproduce(args)
    _merge_feature_stores(args)
    if args.job is not None:
        return _train_job(args)
    recipe = TrainRecipe.from_args(args)
    out = Path(args.out or shipped_dir())
    result = train(recipe, out, options=_run_options(args), progress=tqdm_progress("features"))
    report_training(result, out)
    return 0


def _train_job(args: argparse.Namespace) -> int:
    """``ragscope train --job ID --out DIR``: a background job's worker
    (:func:`core.services.worker.run_train_job`), for a terminal."""
    if not args.out:
        raise DataError("--job needs --out (the folder the job publishes into)", field="out")
    with Store() as store:
        return run_train_job(store, args.job, args.out)


def _runnable(recipe: TrainRecipe, where: Path) -> TrainRecipe:
    """``recipe`` when its model and datasets are names, never paths of this machine
    (cfg.json is anyone's to edit).

    Raises:
        DataError: It names a file or folder.
    """
    recipe_model(recipe.model, where)
    recipe_dataset(recipe.dataset, None, where)
    recipe_dataset(recipe.test_dataset, None, where, "--test-dataset")
    return recipe


def _reproduce(args: argparse.Namespace) -> int:
    """Rebuild every artifact in ``args.reproduce`` from its recorded recipe (through
    :func:`core.evaluation.train.train`) and compare."""
    folder = Path(args.reproduce) if args.reproduce else None
    found = shipped_artifacts(folder=folder)
    if not found:
        raise DataError(
            "no detector artifacts to reproduce here", source=str(folder or "assets/detectors")
        )
    groups: dict[str, tuple[TrainRecipe, list[str]]] = {}
    failed = 0
    for name, path in found.items():
        recorded = TrainedOn.from_cfg(artifact_info(path)).recipe
        if recorded is None:
            raise DataError(
                "the artifact records no training recipe (it predates `--reproduce`); "
                "retrain it with `ragscope train`",
                source=str(path),
            )
        try:
            recipe = TrainRecipe.from_dict(recorded)
        except DataError as e:
            failed += 1
            print(f"CANNOT   {name}: its recorded recipe: {e}")
            continue
        d = recipe.to_dict()
        key = json.dumps({k: v for k, v in d.items() if k not in ("detectors", "command")})
        groups.setdefault(key, (recipe, []))[1].append(name)
    out_root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ragscope-repro-"))
    for shared, names in groups.values():
        recipe = shared.with_detectors(names)
        print(f"rebuilding {', '.join(names)}: {shared.command()}", file=sys.stderr)
        try:  # a dev set not on this machine: say which, rebuild the other recipes
            train(
                _runnable(recipe, found[names[0]]),
                out_root,
                options=_run_options(args),
                progress=tqdm_progress("features"),
            )
        except DataError as e:
            failed += len(names)
            print(f"CANNOT   {', '.join(names)}: {e}")
            continue
        for n in names:
            diffs = compare_artifacts(found[n], out_root / n)
            if diffs:
                failed += 1
                print(f"DIFFERS  {n}: {len(diffs)} difference(s)")
                for diff in diffs[:10]:
                    print(f"    {diff}")
            else:
                print(f"same     {n} ({found[n]} == {out_root / n})")
    print(f"{len(found) - failed}/{len(found)} artifacts reproduced; rebuilds in {out_root}")
    return 1 if failed else 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {
    "evaluate": _add_evaluate,
    "train": _add_train,
}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
