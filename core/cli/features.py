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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash
from core.base.safeio import replace_file
from core.cli.common import (
    REPORT_LINES,
    Subparsers,
    add_detector_option_args,
    add_engine_args,
    add_model_args,
    detector_options,
    extract_on_ray,
    import_feature_stores,
    load,
)
from core.data import data_hash, resolve_datasets, stratified_head
from core.detectors.registry import MEMBERS
from core.engine.model import LoadedModel
from core.evaluation.crossval import default_maker
from core.learning.contract import Detector, Features
from core.pipeline.extract import FeatureCache, iter_features, plain_detectors
from core.pipeline.featurestore import ShardWriter, feature_key, read_manifest
from core.storage import Store


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
    add_engine_args(p)
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
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="also write the features as Parquet shards into DIR, a feature store to share "
        "(`ragscope features import DIR` elsewhere); examples DIR holds are skipped, and "
        "features already in the local cache are exported without tracing",
    )
    p.set_defaults(func=cmd_extract)


def _add_features(sub: Subparsers) -> None:
    p = sub.add_parser(
        "features", help="a Parquet feature store: merge it into the local cache, or describe it"
    )
    p.add_argument("action", choices=("import", "info"))
    p.add_argument("folders", nargs="+", metavar="DIR", help="feature store folders")
    p.add_argument(
        "--dataset",
        default=None,
        help="import: also check the rows of these examples against them (each row's "
        "example hash, offsets within its answer); rows of other examples are checked "
        "when they are used",
    )
    p.set_defaults(func=cmd_features)


def cmd_features(args: argparse.Namespace) -> int:
    """``features import DIR...`` / ``features info DIR...``."""
    if args.action == "info":
        for folder in args.folders:
            print(json.dumps({"folder": folder, **read_manifest(folder)}, indent=2))
        return 0
    examples = resolve_datasets(args.dataset, on_error="skip")[1] if args.dataset else []
    lines = import_feature_stores(args.folders, examples)
    print("\n".join(lines))
    return 1 if any(line.startswith("REJECTED") for line in lines) else 0


def cmd_extract(args: argparse.Namespace) -> int:
    """Extract and store; print a summary; exit 1 when some example failed."""

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
    flat = plain_detectors(detectors)
    writer = _writer(args, model, examples, flat) if args.out else None
    held: set[str] = set()
    if writer is not None:
        held = {
            e.id
            for e in examples
            if all(writer.holds(feature_key(model.info.key, e, d)) for d in flat)
        }
        examples = [e for e in examples if e.id not in held]
    reasons = [f"{d.name}: {why}" for d in detectors if (why := d.unavailable(model.info))]
    if reasons:
        raise DataError(
            f"these detectors cannot read {model.info.display_name}: {'; '.join(reasons)}",
            field="detectors",
        )
    counts = {"computed": 0, "stored": 0, "failed": 0}
    failures: list[dict[str, str]] = []
    t0 = time.perf_counter()
    try:
        if args.engine == "ray":
            with Store() as store:
                counts, failures = extract_on_ray(args, model, examples, names, flat, store, writer)
        else:
            _extract_here(args, model, examples, detectors, flat, writer, counts, failures)
    finally:  # a stopped run (an error, Ctrl-C) still stores what it finished
        if writer is not None:
            writer.close()
    seconds = time.perf_counter() - t0
    shard_txt = f" (shard {shard[0]}/{shard[1]})" if shard else ""
    print(
        f"{len(examples)} examples of {', '.join(sets)}{shard_txt} x {len(names)} detectors on "
        f"{model.info.display_name}: {counts['computed']} computed, {counts['stored']} already "
        f"stored, {counts['failed']} failed, in {seconds:.0f} s"
    )
    if writer is not None:
        print(
            f"feature store {args.out}: {len(held)} examples held already, {writer.written} "
            "rows written"
        )
    for f in failures[:REPORT_LINES]:
        print(f"FAILED {f['example']}: {f['error']}")
    if len(failures) > REPORT_LINES:
        print(f"... and {len(failures) - REPORT_LINES} more (see --report)")
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
        replace_file(args.report, json.dumps(report, indent=2))
    return 1 if failures else 0


def _extract_here(
    args: argparse.Namespace,
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    flat: Sequence[Detector],
    writer: ShardWriter | None,
    counts: dict[str, int],
    failures: list[dict[str, str]],
) -> None:
    """In-process extraction into the local cache (and ``writer``), counting as it goes."""
    with Store() as store:
        stream = iter_features(
            model,
            examples,
            detectors,
            cache=FeatureCache(store),
            on_error="skip",
            batch_size=args.batch_size,
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
                    if writer is not None and got.features is not None:
                        for d in flat:
                            key = feature_key(model.info.key, got.example, d)
                            writer.add(key, got.example, _plain(got.features, d.name))
                        writer.example_done()
                bar.update(1)
                bar.set_postfix(counts, refresh=False)


def _writer(
    args: argparse.Namespace,
    model: LoadedModel,
    examples: Sequence[RAGExample],
    flat: Sequence[Detector],
) -> ShardWriter:
    """The Parquet writer of ``--out``, with this run's manifest."""
    # Keyed by the answers' own datasets (what routing and calibration read), not the specs.
    names = dict.fromkeys(str(e.provenance.dataset) for e in examples)
    by_set = {s: [e for e in examples if e.provenance.dataset == s] for s in names}
    manifest = {
        "model": model.info.key,
        "detectors": {
            d.name: {"feature_hash": d.config.feature_hash(), "config": d.config.to_dict()}
            for d in flat
        },
        "datasets": {s: data_hash(exs) for s, exs in by_set.items() if exs},
    }
    hashes = {example_hash(e) for e in examples}
    return ShardWriter(
        Path(args.out),
        manifest=json.loads(json.dumps(manifest, default=list)),
        wanted=lambda key: key[0] == model.info.key and key[1] in hashes,
    )


def _plain(features: Mapping[str, Features], name: str) -> Features:
    """A plain detector's features from a composed set (or a composite's member)."""
    if name in features and features[name].members is None:
        return features[name]
    for f in features.values():
        if f.members is not None and name in f.members:
            return f.members[name]
    raise DataError(f"no features of {name!r} were extracted")


_PARSERS = {"extract": _add_extract, "features": _add_features}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
