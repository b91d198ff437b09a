"""Fitting detectors: ``evaluate`` (fit on train, or load artifacts; threshold on
validation; report on test) and ``train`` (fit and save the artifacts, or with
``--reproduce`` rebuild saved ones from their recorded recipe and compare)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.cli.common import Subparsers, add_model_args, eval_splits, load, tqdm_progress
from core.contract import artifact_info, compare_artifacts
from core.detectors import shipped_artifacts
from core.errors import DataError
from core.evaluate import EvalRun, evaluate
from core.extract import FeatureCache
from core.model import LoadedModel
from core.paths import runs_dir, shipped_dir
from core.smoothing import P_STAY_TOKEN
from core.storage import Store


def _fit_parser(sub: Subparsers, cmd: str, helptext: str) -> argparse.ArgumentParser:
    """The parser of ``evaluate`` or ``train`` with the options they share."""
    p = sub.add_parser(cmd, help=helptext)
    add_model_args(p)
    p.add_argument(
        "--dataset", default="builtin", help="demo, builtin, a file/folder or a stored name"
    )
    p.add_argument("--test-dataset", default=None, help="cross-dataset: test on all of this one")
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
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="DETECTOR.OPTION=VALUE",
        help="a detector option (repeatable), e.g. redeep_token.scorer=logistic or "
        "redeep_chunk.pool=sum; options that only change learning reuse cached features",
    )
    return p


def _detector_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``--set NAME.OPTION=VALUE`` flags -> ``{name: {option: value}}`` (values read as JSON
    when they parse, else as strings: ``scorer=logistic``, ``pool=sum``, ``topk_frac=0.2``)."""
    out: dict[str, dict[str, Any]] = {}
    for item in getattr(args, "set", None) or []:
        key, eq, raw = item.partition("=")
        name, dot, option = key.partition(".")
        if not (eq and dot and name and option):
            raise DataError(
                f"--set {item!r}: write DETECTOR.OPTION=VALUE, e.g. redeep_token.scorer=logistic"
            )
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(name, {})[option] = value
    return out


def _add_evaluate(sub: Subparsers) -> None:
    p = _fit_parser(
        sub,
        "evaluate",
        "fit on the train split (or load artifacts), threshold on validation, report on test",
    )
    p.add_argument(
        "--artifacts",
        default=None,
        help="load detectors from this folder instead of training",
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    names = [d for d in args.detectors.split(",") if d]
    train_name, test_name, splits = eval_splits(args)
    model = load(args)
    artifacts = {}
    if args.artifacts:
        artifacts = {n: Path(args.artifacts) / n for n in names}
    with Store() as store:
        run = evaluate(
            model,
            names,
            train=[] if artifacts else splits["train"],
            validation=splits["validation"],
            test=splits["test"],
            train_dataset=train_name,
            test_dataset=test_name,
            artifacts=artifacts,
            cache=None if args.no_cache else FeatureCache(store),
            progress=tqdm_progress("features"),
            n_boot=args.bootstrap,
            name=args.name,
            configs=_detector_options(args),
            smooth=args.smooth,
        )
    j, m = run.save(args.out or runs_dir())
    print(run.to_markdown())
    print(f"\nsaved {j} and {m}")
    return 0


def _add_train(sub: Subparsers) -> None:
    p = _fit_parser(
        sub, "train", "train detectors and save their artifacts (reproduces assets/detectors)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="artifact folder, one subfolder each (default: assets/detectors; "
        "with --reproduce: a temporary folder)",
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


def _train_recipe(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The inputs that rebuild a training run, recorded in every artifact it saves."""
    recipe: dict[str, Any] = {
        "model": args.model,
        "dataset": args.dataset,
        "test_dataset": args.test_dataset,
        "detectors": names,
        "limit": args.limit,
        "seed": args.seed,
        "options": _detector_options(args),
    }
    cmd = ["ragscope train", f"--model {args.model}", f"--dataset {args.dataset}"]
    if args.test_dataset:
        cmd.append(f"--test-dataset {args.test_dataset}")
    if args.limit:
        cmd.append(f"--limit {args.limit}")
    cmd += [f"--seed {args.seed}", f"--detectors {','.join(names)}"]
    cmd += [f"--set {item}" for item in getattr(args, "set", None) or []]
    recipe["command"] = " ".join(cmd)
    return recipe


def _train(
    args: argparse.Namespace, names: list[str], out: str | Path, model: LoadedModel | None = None
) -> EvalRun:
    train_name, test_name, splits = eval_splits(args)
    model = model or load(args)
    with Store() as store:
        return evaluate(
            model,
            names,
            train=splits["train"],
            validation=splits["validation"],
            test=splits["test"],
            train_dataset=train_name,
            test_dataset=test_name,
            cache=None if getattr(args, "no_cache", False) else FeatureCache(store),
            progress=tqdm_progress("features"),
            n_boot=args.bootstrap,
            save_artifacts=out,
            recipe=_train_recipe(args, names),
            configs=_detector_options(args),
        )


def cmd_train(args: argparse.Namespace) -> int:
    if args.reproduce is not None:
        return _reproduce(args)

    names = [d for d in args.detectors.split(",") if d]
    run = _train(args, names, args.out or shipped_dir())
    print(run.to_markdown())
    for r in run.results:
        print(f"saved {r.detector} -> {r.artifact}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    """Rebuild every artifact in ``args.reproduce`` from its recorded recipe and compare."""
    import tempfile

    folder = Path(args.reproduce) if args.reproduce else None
    found = shipped_artifacts(folder=folder)
    if not found:
        raise DataError(
            "no detector artifacts to reproduce here", source=str(folder or "assets/detectors")
        )
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for name, path in found.items():
        recipe = (artifact_info(path).get("trained_on") or {}).get("recipe")
        if not recipe:
            raise DataError(
                "the artifact records no training recipe (it predates `--reproduce`); "
                "retrain it with `ragscope train`",
                source=str(path),
            )
        key = json.dumps({k: v for k, v in recipe.items() if k not in ("detectors", "command")})
        groups.setdefault(key, (recipe, []))[1].append(name)
    failed = 0
    out_root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ragscope-repro-"))
    for recipe, names in groups.values():
        ns = argparse.Namespace(**vars(args))
        for k in ("model", "dataset", "test_dataset", "limit", "seed"):
            setattr(ns, k, recipe.get(k))
        opts = (recipe.get("options") or {}).items()
        ns.set = [f"{d}.{k}={json.dumps(v)}" for d, o in opts if d in names for k, v in o.items()]
        print(f"rebuilding {', '.join(names)}: {recipe.get('command', recipe)}", file=sys.stderr)
        _train(ns, names, out_root)
        for n in names:
            diffs = compare_artifacts(found[n], out_root / n)
            if diffs:
                failed += 1
                print(f"DIFFERS  {n}: {len(diffs)} difference(s)")
                for d in diffs[:10]:
                    print(f"    {d}")
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
