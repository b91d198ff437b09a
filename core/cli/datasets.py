"""``datasets validate|import|list``: check a dataset file, store it, list the stored
ones."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from core.base.words import counted
from core.cli.common import Subparsers
from core.data import load_dataset
from core.storage import Store


def _add_datasets(sub: Subparsers) -> None:
    p = sub.add_parser("datasets", help="validate, import or list datasets")
    dsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    formats = ["auto", "ragtruth_jsonl", "ragtruth_pair", "interpdetect", "generic", "ragscope"]
    for action, helptext in (
        ("validate", "read a dataset and list every bad record (nothing is stored)"),
        ("import", "store a dataset (all or nothing; --skip-bad keeps the good records)"),
    ):
        d = dsub.add_parser(action, help=helptext)
        d.add_argument("path", help="file or folder")
        d.add_argument("--format", default="auto", choices=formats)
        if action == "import":
            d.add_argument("--name", help="name to store the dataset under (default: file stem)")
            d.add_argument(
                "--skip-bad",
                action="store_true",
                help="skip bad records and report them (stores nothing when none is good)",
            )
            d.add_argument("--replace", action="store_true", help="replace a stored dataset")
        else:
            d.add_argument("--max-errors", type=int, default=20, help="errors to print")
        d.set_defaults(func=cmd_datasets)
    d = dsub.add_parser("list", help="the stored datasets")
    d.set_defaults(func=cmd_datasets)


def cmd_datasets(args: argparse.Namespace) -> int:
    if args.action == "list":
        with Store() as store:
            rows = store.list_datasets()
        if not rows:
            print("no stored datasets; add one with `ragscope datasets import PATH --name NAME`")
        for r in rows:
            print(f"{r.name}\t{counted(r.n_examples, 'example')}\t{r.format}\t{r.source}")
        return 0
    if args.action == "validate":
        report = load_dataset(args.path, fmt=args.format, on_error="skip")
        print(report.summary(max_errors=args.max_errors, max_warnings=args.max_errors))
        return 1 if report.errors else 0
    report = load_dataset(args.path, fmt=args.format, on_error="skip" if args.skip_bad else "raise")
    print(report.summary())
    report.require_examples()

    name = args.name or Path(args.path).stem
    with Store() as store:
        n = store.import_dataset(
            name,
            list(report.examples),
            source=str(args.path),
            fmt=report.fmt,
            replace=args.replace,
        )
    print(
        f"imported {counted(n, 'example')} as {name!r}"
        + (f" (skipped {len(report.errors)} bad)" if report.errors else "")
    )
    return 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {"datasets": _add_datasets}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
