"""``ragscope adapt``: fit the detector set to a dataset from its reviews (a derived set
that judges the dataset's answers from then on; :mod:`core.services.adapting`), in a
terminal or as the worker of the Review page's background job (``--job``)."""

from __future__ import annotations

import argparse

from core.base.errors import DataError
from core.base.paths import adapted_sets_dir
from core.cli.common import (
    Subparsers,
    add_model_args,
    help_epilog,
    load,
    tqdm_progress,
)
from core.data import resolve_dataset
from core.evaluation.adapt import MIN_ADAPT_ANSWERS, MIN_ADAPT_CLASS
from core.pipeline.sets import load_set
from core.services.adapting import AdaptResult, adapt_set
from core.services.worker import run_adapt_job
from core.storage import Store


def _add_adapt(sub: Subparsers) -> None:
    p = sub.add_parser(
        "adapt",
        help="fit the detector set to a dataset from its reviewed answers: each detector's "
        "calibration and threshold of the dataset's own, as a derived set that judges its "
        "answers from then on (the base set is untouched)",
        epilog=help_epilog(
            [
                ("ragscope adapt stored:my-answers", "from the reviews of a stored dataset"),
                (
                    "ragscope adapt shared:dolly_ac_dev --queue shared:dolly_ac_dev.jsonl",
                    "from the Review page's queue of a shared dev set",
                ),
            ]
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "dataset",
        metavar="DATASET",
        nargs="?",
        default=None,
        help="the answers: demo, builtin, shared:NAME, stored:NAME or a file",
    )
    p.add_argument(
        "--queue",
        default=None,
        help="the review queue holding the reviews (default: DATASET; the Review page keys "
        "its queues stored:NAME, shared:NAME.jsonl, builtin:demo and corpus)",
    )
    p.add_argument("--set", default=None, metavar="NAME", help="the base detector set by name")
    p.add_argument(
        "--refit",
        action="store_true",
        help="also fit the ensemble's stacker of the dataset's own on every reviewed answer "
        f"(at least {MIN_ADAPT_ANSWERS}, {MIN_ADAPT_CLASS} of each class); its calibration "
        "then reads that stacker's out-of-fold scores",
    )
    add_model_args(p)
    p.add_argument("--job", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_adapt)


def _report(result: AdaptResult) -> None:
    r = result.record
    print(
        f"adapted the {r.deferred_from or r.base_set} set to {result.dataset} from "
        f"{r.n_reviews} reviewed answers ({r.n_random} in the random order, "
        f"{r.n_random_hallucinated} of them hallucinated) -> {result.folder}"
    )
    if r.refit:
        print(f"  {r.refit}")
    for a in result.detectors:
        if a.calibration is not None:
            c = a.calibration
            print(f"  {a.name}: own calibration, threshold {c.threshold:.3f} ({c.n} answers)")
        else:
            print(f"  {a.name}: not calibrated ({a.reason})")


def cmd_adapt(args: argparse.Namespace) -> int:
    if args.job is not None:
        return _adapt_job(args)
    if not args.dataset:
        raise DataError("name the answers to adapt to: ragscope adapt DATASET", field="dataset")
    model = load(args)
    _, examples = resolve_dataset(args.dataset)
    with Store() as store:
        result = adapt_set(
            store,
            model,
            load_set(model.info.key, args.set),
            args.queue or args.dataset,
            examples,
            adapted_sets_dir(model.info.key),
            refit=args.refit,
            progress=tqdm_progress("judge the reviewed answers"),
        )
    _report(result)
    return 0


def _adapt_job(args: argparse.Namespace) -> int:
    """``ragscope adapt --job ID --out DIR``: an adaptation job's worker
    (:func:`core.services.worker.run_adapt_job`), for a terminal."""
    if not args.out:
        raise DataError("--job needs --out (the folder the job publishes into)", field="out")
    with Store() as store:
        return run_adapt_job(store, args.job, args.out)


_PARSERS = {"adapt": _add_adapt}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
