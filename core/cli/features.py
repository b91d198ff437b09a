"""``extract``: compute and store every detector's features for every example.

Features go to the local feature cache (the SQLite store, ``RAGSCOPE_DB``), keyed like
every other reader of it (model key, example content hash, detector name and feature
config hash), so ``evaluate``, ``train`` and the app find them. An example's features
are written as soon as it is traced: a stopped run loses at most the example in hand,
and re-running skips everything stored. ``--shard I/N`` lets N processes (or machines
sharing the store's folder) split one dataset between them without overlap.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from core.cli.common import (
    Subparsers,
    add_detector_option_args,
    add_model_args,
    detector_options,
    load,
)
from core.crossval import default_maker
from core.data import resolve_datasets, stratified_head
from core.detectors.registry import MEMBERS
from core.errors import DataError
from core.extract import FeatureCache, iter_features
from core.storage import Store

REPORT_ERRORS = 20
"""Failed examples printed (all of them go to ``--report``)."""


def parse_shard(raw: str | None) -> tuple[int, int] | None:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``; ``None`` for no sharding.

    Raises:
        DataError: Anything else, naming the form.
    """
    if raw is None:
        return None
    i, slash, n = raw.partition("/")
    try:
        shard = (int(i), int(n)) if slash else None
    except ValueError:
        shard = None
    if shard is None or not 0 <= shard[0] < shard[1]:
        raise DataError(
            f"--shard {raw!r}: write I/N with 0 <= I < N, e.g. 0/2 and 1/2 for two processes",
            field="shard",
        )
    return shard


def _add_extract(sub: Subparsers) -> None:
    p = sub.add_parser(
        "extract",
        help="compute and store every detector's features for every example (resumable: "
        "re-running skips what is stored)",
    )
    add_model_args(p)
    p.add_argument(
        "--dataset",
        required=True,
        help="demo, builtin, shared:NAME, a file/folder or a stored name; several comma-separated",
    )
    p.add_argument(
        "--detectors",
        default=",".join(MEMBERS.names()),
        help="comma-separated names (default: every detector the ensemble stacks)",
    )
    add_detector_option_args(p)
    p.add_argument(
        "--on-error",
        choices=("skip", "stop"),
        default="skip",
        help="an example that cannot be traced (e.g. longer than the model's context): skip "
        "it and report it at the end (default), or stop there (what is stored stays)",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="only examples I, I+N, I+2N, ... (run N processes, shards 0/N .. N-1/N, on one store)",
    )
    p.add_argument(
        "--limit", type=int, default=None, help="about this many examples (whole sources)"
    )
    p.add_argument(
        "--report", default=None, help="also write a JSON report (counts, failures) here"
    )
    p.set_defaults(func=cmd_extract)


def cmd_extract(args: argparse.Namespace) -> int:
    """Extract and store; print a summary; exit 1 when some example failed."""
    from tqdm import tqdm

    shard = parse_shard(args.shard)
    names = [d.strip() for d in args.detectors.split(",") if d.strip()]
    if not names:
        raise DataError("no detectors given", field="detectors")
    sets, examples = resolve_datasets(args.dataset, on_error="skip")
    if args.limit:
        examples = stratified_head(examples, args.limit)
    if shard is not None:
        examples = examples[shard[0] :: shard[1]]
    make = default_maker(detector_options(args))
    detectors = [make(n) for n in names]
    model = load(args)
    reasons = [f"{d.name}: {why}" for d in detectors if (why := d.unavailable(model.info))]
    if reasons:
        raise DataError(
            f"these detectors cannot read {model.info.display_name}: {'; '.join(reasons)}",
            field="detectors",
        )
    counts = {"computed": 0, "stored": 0, "failed": 0}
    failures: list[dict[str, str]] = []
    t0 = time.perf_counter()
    with Store() as store:
        stream = iter_features(
            model,
            examples,
            detectors,
            cache=FeatureCache(store),
            on_error="skip",
        )
        with tqdm(total=len(examples), desc="features", unit="ex", file=sys.stderr) as bar:
            for got in stream:
                if got.error is not None and args.on_error == "stop":
                    done = counts["computed"] + counts["stored"]
                    raise DataError(
                        f"example {got.example.id!r}: {got.error}. Stopped there; the {done} "
                        "examples before it are stored (re-run to resume, or --on-error skip)"
                    )
                if got.error is not None:
                    counts["failed"] += 1
                    failures.append({"example": got.example.id, "error": str(got.error)})
                else:
                    counts["computed" if got.computed else "stored"] += 1
                bar.update(1)
                bar.set_postfix(counts, refresh=False)
    seconds = time.perf_counter() - t0
    shard_txt = f" (shard {shard[0]}/{shard[1]})" if shard else ""
    print(
        f"{len(examples)} examples of {', '.join(sets)}{shard_txt} x {len(names)} detectors on "
        f"{model.info.display_name}: {counts['computed']} computed, {counts['stored']} already "
        f"stored, {counts['failed']} failed, in {seconds:.0f} s"
    )
    for f in failures[:REPORT_ERRORS]:
        print(f"FAILED {f['example']}: {f['error']}")
    if len(failures) > REPORT_ERRORS:
        print(f"... and {len(failures) - REPORT_ERRORS} more (see --report)")
    if args.report:
        report: dict[str, Any] = {
            "datasets": sets,
            "detectors": names,
            "model": model.info.key,
            "shard": list(shard) if shard else None,
            "n": len(examples),
            **counts,
            "seconds": round(seconds, 3),
            "failures": failures,
        }
        Path(args.report).write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


_PARSERS = {"extract": _add_extract}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
