"""The top-level ``ragscope`` parser and the dispatch to the chosen command.

Each command group registers its commands here, in the order ``ragscope --help`` lists
them; a ``RagscopeError`` (an error raised on purpose, naming the fix) prints one line
and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

import core.cli.adapting as adapting
import core.cli.analysis as analysis
import core.cli.artifacts as artifacts
import core.cli.datasets as datasets
import core.cli.features as features
import core.cli.generation as generation
import core.cli.judging as judging
import core.cli.mitigation as mitigation
import core.cli.model as model
import core.cli.sae as sae
import core.cli.training as training
from core.base.errors import RagscopeError

# (group module, command) in the order the commands are registered and listed.
COMMANDS: tuple[tuple[ModuleType, str], ...] = (
    (model, "info"),
    (model, "prepare"),
    (generation, "generate"),
    (analysis, "trace"),
    (datasets, "datasets"),
    (features, "extract"),
    (features, "features"),
    (training, "evaluate"),
    (training, "train"),
    (judging, "judge"),
    (adapting, "adapt"),
    (analysis, "spad-check"),
    (analysis, "shap"),
    (mitigation, "mitigate"),
    (artifacts, "token-thresholds"),
    (artifacts, "span-rule"),
    (model, "serve-llm"),
    (artifacts, "artifacts"),
    (sae, "sae"),
    (generation, "answer"),
    (mitigation, "aarf"),
    (model, "bench"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragscope",
        description="Inspect, from a language model's internals, where a RAG answer departs from its sources.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group, command in COMMANDS:
        group.add_parser(sub, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RagscopeError as e:
        print(f"ragscope {args.command}: error: {e}", file=sys.stderr)
        return 2
