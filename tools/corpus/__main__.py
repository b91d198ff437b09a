"""Rebuild the built-in corpus: ``python -m tools.corpus [--seed N] [--out DIR]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from core.base.paths import builtin_dir
from tools.corpus.build import write_corpus


def main(argv: Sequence[str] | None = None) -> int:
    """Build the corpus, write it, print the counts as JSON; returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m tools.corpus",
        description="Rebuild ragscope's built-in labelled corpus (corpus.jsonl + corpus.meta.json).",
    )
    p.add_argument("--seed", type=int, default=0, help="build seed (the shipped corpus uses 0)")
    p.add_argument(
        "--out", type=Path, default=None, help=f"output folder (default: {builtin_dir()})"
    )
    args = p.parse_args(argv)
    counts = write_corpus(args.out, seed=args.seed)
    json.dump(counts, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
