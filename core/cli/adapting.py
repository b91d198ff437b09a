"""``ragscope adapt``: fit the detector set to a dataset from its reviews (a derived set
that judges the dataset's answers from then on; :mod:`core.services.adapting`), in a
terminal or as the worker of the Review page's background job (``--job``)."""

from __future__ import annotations

import argparse
import json
import sys

from core.base.errors import DataError
from core.base.paths import adapted_sets_dir
from core.cli.common import (
    Subparsers,
    add_model_args,
    help_epilog,
    load,
    progress,
    tqdm_progress,
)
from core.data import resolve_dataset
from core.engine.model import load_model
from core.evaluation.adapt import MIN_ADAPT_ANSWERS, MIN_ADAPT_CLASS
from core.pipeline.sets import ADAPTED_FILE, load_set
from core.services.adapting import AdaptResult, adapt_set
from core.services.jobs import AdaptSpec, JobRunner
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
    """``ragscope adapt --job ID --out DIR``: the worker of an adaptation job; it reads
    its spec from the job's row (the command line's other options are not read) and
    publishes the derived set into ``--out`` only when it is written whole."""
    with Store() as store:
        spec = AdaptSpec.from_dict(store.get_job(args.job).spec)
        runner = JobRunner(store, args.job, out=args.out)
        with runner:
            runner.stage("Loading the model")
            model = load_model(spec.model, device=spec.device, progress=progress)
            runner.check_model(model.info.key)
            runner.stage("Reading the reviews")
            _, examples = resolve_dataset(spec.dataset)
            result = adapt_set(
                store,
                model,
                load_set(model.info.key, spec.set_name),
                spec.queue,
                examples,
                runner.staging,
                refit=spec.refit,
                progress=runner.progress,
            )
            runner.publish([result.folder.name], marker=ADAPTED_FILE)
            runner.result = result.summary()
            print(json.dumps(runner.result, indent=1))
    if runner.status == "cancelled":
        print(f"job #{args.job} was cancelled; nothing was published", file=sys.stderr)
        return 1
    return 0


_PARSERS = {"adapt": _add_adapt}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
