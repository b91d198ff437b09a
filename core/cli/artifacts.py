"""Saved detector artifacts: ``token-thresholds`` (record each artifact's token threshold
for flagging spans) and ``artifacts verify|seal`` (check hashes, allowlists and a full
load, or record the file hashes)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from core.base.errors import DataError, RagscopeError
from core.base.paths import detector_set_dir, detector_set_name, detector_set_names, shipped_dir
from core.base.safeio import replace_file
from core.cli.common import Subparsers, add_model_args, load, recipe_dataset
from core.data import (
    data_hash,
    make_splits,
)
from core.detectors import detector_class, seal_artifact, shipped_artifacts
from core.evaluation.cv_run import CVRun
from core.evaluation.evaluate import token_threshold
from core.evaluation.runs import load_run
from core.evaluation.span_choice import recorded_rule
from core.learning.artifact import artifact_info
from core.pipeline.extract import FeatureCache, extract_features
from core.pipeline.sets import ANSWER_JUDGE, TrainedOn, expert_names
from core.storage import Store


def _add_token_thresholds(sub: Subparsers) -> None:
    p = sub.add_parser(
        "token-thresholds",
        help="record each detector artifact's token threshold (best token F1 on its "
        "validation split) for flagging spans",
    )
    add_model_args(p)
    p.add_argument("--folder", default=None, help="artifact folder (default: the shipped one)")
    p.add_argument("--detectors", default=None, help="comma-separated (default: every one)")
    p.add_argument("--dataset", default=None, help="for artifacts without a training recipe")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_token_thresholds)


def cmd_token_thresholds(args: argparse.Namespace) -> int:
    """Record each artifact's token threshold (best token F1 on its own validation split).

    The split comes from the artifact's training recipe (so the answers are ones it
    did not learn from); artifacts without a recipe use ``--dataset``. The threshold
    goes into the artifact's ``cfg.json`` as ``token_threshold`` (with where it came
    from); detectors that score no tokens are listed and left alone.
    """
    folder = Path(args.folder) if args.folder else None
    model = load(args)
    found = shipped_artifacts(model.info.key, folder=folder)
    names = [d for d in args.detectors.split(",") if d] if args.detectors else sorted(found)
    missing = [n for n in names if n not in found]
    if missing:
        raise DataError(f"no artifact for {', '.join(missing)}", source=str(folder or "assets"))
    rows = []
    with Store() as store:
        for n in names:
            path = Path(found[n])
            recipe = dict(TrainedOn.from_cfg(artifact_info(path)).recipe or {})
            spec = recipe_dataset(recipe.get("dataset"), args.dataset, path)
            if spec is None:
                raise DataError(
                    "the artifact records no training recipe: give --dataset", source=str(path)
                )
            limit = recipe.get("limit") if recipe else args.limit
            seed = recipe.get("seed", args.seed) if recipe else args.seed
            name, _, splits = make_splits(spec, limit=limit, seed=seed)
            val = splits["validation"]
            det = detector_class(n).load(path, model_key=model.info.key)
            ext = extract_features(model, val, [det], cache=FeatureCache(store), on_error="skip")
            verdicts = [det.predict(f) for f in ext.features[n]]
            t = token_threshold(list(ext.examples), verdicts)
            if t is None:
                rows.append((n, "-", "scores no tokens (or one class only)"))
                continue
            cfg_path = path / "cfg.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["token_threshold"] = t
            cfg["token_threshold_from"] = {
                "dataset": name,
                "split": "validation",
                "n": len(ext.examples),
                "data_hash": data_hash(list(ext.examples)),
                "criterion": "token F1",
            }
            cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
            rows.append((n, f"{t:.3f}", f"{name} validation, {len(ext.examples)} answers"))
    print("| detector | token threshold | from |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


def _add_span_rule(sub: Subparsers) -> None:
    p = sub.add_parser(
        "span-rule",
        help="record in a detector artifact the span rule a cross-validation chose for it "
        "(span F1 on out-of-fold token scores), so a set shows spans by it",
    )
    p.add_argument("run", help="a saved cross-validation run (.json) that scored the detector")
    p.add_argument("folder", help="the artifact folder to record it in (holds cfg.json)")
    p.add_argument("--detector", default=ANSWER_JUDGE, help="the run's detector whose rule to take")
    p.set_defaults(func=cmd_span_rule)


def cmd_span_rule(args: argparse.Namespace) -> int:
    """Record a CV run's span rule for ``--detector`` in ``folder``'s ``cfg.json`` (written
    beside it and renamed over it; the artifact's file hashes do not cover ``cfg.json``)."""
    run = load_run(args.run)
    if not isinstance(run, CVRun):
        raise DataError("not a cross-validation run", source=args.run)
    result = next((r for r in run.results if r.detector == args.detector), None)
    if result is None or not result.span_rule:
        raise DataError(
            f"the run chose no span rule for {args.detector!r} (it needs token scores and "
            "span labels): run `ragscope evaluate --cv 5` on data with spans",
            source=args.run,
        )
    folder = Path(args.folder)
    info = artifact_info(folder)
    if info.get("detector") != args.detector:
        raise DataError(
            f"the artifact holds {info.get('detector')!r}, not {args.detector!r}",
            source=str(folder),
        )
    rule = recorded_rule(result.span_rule, run.name, run.datasets)
    cfg_path = folder / "cfg.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["span_rule"] = rule.to_json()
    replace_file(cfg_path, json.dumps(cfg, indent=2) + "\n")
    print(f"{folder}: spans by {rule.describe()}")
    m = rule.measured
    print(
        f"measured on {m['datasets']} ({m['n_answers']} answers, run {run.name}): span "
        f"P {m['precision']:.3f} R {m['recall']:.3f} F1 {m['f1']:.3f}; faithful characters "
        f"flagged {m['faithful_share']:.1%}; flagging everything: F1 "
        f"{m['flag_everything_f1']:.3f}"
    )
    return 0


def _add_artifacts(sub: Subparsers) -> None:
    p = sub.add_parser(
        "artifacts",
        help="verify detector artifacts (file hashes, exact type allowlists, a full load) or "
        "record the file hashes of ones you made with an older ragscope",
    )
    p.add_argument(
        "action",
        choices=["verify", "seal", "sets"],
        help="verify or seal artifacts; sets: list the shipped detector sets and what "
        "each was trained on (pick one with RAGSCOPE_DETECTOR_SET)",
    )
    p.add_argument(
        "folders",
        nargs="*",
        help="artifact folders, or folders of them (default: the loaded detector set)",
    )
    p.set_defaults(func=cmd_artifacts)


def _artifact_folders(paths: Sequence[str]) -> list[Path]:
    """Artifact folders named on the command line: a folder holding ``cfg.json`` is one;
    any other folder is searched one level down (default: the shipped folder)."""
    roots = [Path(p) for p in paths] or [shipped_dir()]
    out: list[Path] = []
    for r in roots:
        if (r / "cfg.json").is_file():
            out.append(r)
        elif r.is_dir():
            out += [s for s in sorted(r.iterdir()) if (s / "cfg.json").is_file()]
        else:
            raise DataError("no such artifact folder", source=str(r))
    if not out:
        raise DataError(
            "no detector artifacts here (folders holding cfg.json)",
            source=", ".join(map(str, roots)),
        )
    return out


def _list_sets() -> int:
    """One line per shipped detector set: name, folder, detectors and training data."""
    loaded = detector_set_name()
    for name in detector_set_names():
        folder = detector_set_dir(name)
        found = shipped_artifacts(folder=folder)
        data: dict[str, None] = {}
        for path in found.values():
            trained = TrainedOn.from_cfg(artifact_info(path))
            if trained.spec is not None:
                data[trained.spec] = None
        mark = "*" if name == loaded else " "
        try:
            experts = expert_names(folder)
            defers = f"  defers to {', '.join(experts)}" if experts else ""
        except DataError as e:
            defers = f"  experts.json unreadable: {e}"
        noun = "detector" if len(found) == 1 else "detectors"
        print(
            f"{mark} {name:<10} {len(found):>2} {noun:<9}  trained on "
            f"{', '.join(data) or 'unrecorded data'}{defers}  ({folder})"
        )
    return 0


def cmd_artifacts(args: argparse.Namespace) -> int:
    """Verify artifacts (hashes, allowlists, a full load), record their file hashes, or
    list the shipped detector sets."""
    if args.action == "sets":
        return _list_sets()
    failed = 0
    for folder in _artifact_folders(args.folders):
        try:
            if args.action == "seal":
                for f in seal_artifact(folder):
                    print(f"sealed {f}")
            else:
                name = str(artifact_info(folder).get("detector"))
                detector_class(name).load(folder, model_key=None)
                print(f"ok      {name:<14} {folder}")
        except RagscopeError as e:
            failed += 1
            print(f"refused {folder}: {e}", file=sys.stderr)
    return 1 if failed else 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {
    "token-thresholds": _add_token_thresholds,
    "span-rule": _add_span_rule,
    "artifacts": _add_artifacts,
}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
