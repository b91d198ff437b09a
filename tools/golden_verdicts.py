"""The verdicts the shipped sets give on the embedded model, kept as the reference that a
speed change must not move (issue 53).

``python -m tools.golden_verdicts`` judges :data:`FAST_IDS` with the ``fast`` set and
:data:`DEFAULT_IDS` with the default set, on the embedded model, and writes each
answer's record (``ragscope judge``'s schema, without its timing) to
``tests/fixtures/golden_verdicts.json``. ``tests/integration/test_demo_spans.py``
judges the same answers and compares: every flag and span equal, every probability
within :data:`TOLERANCE`. Run it again only when the shipped artifacts change on
purpose (retraining), never to make a speed change pass.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from core.base.examples import RAGExample
from core.base.paths import DEFAULT_SET
from core.data import builtin_examples, resolve_dataset
from core.engine.model import LoadedModel, load_model
from core.pipeline.judge import judge
from core.pipeline.sets import load_set

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "fixtures" / "golden_verdicts.json"
FAST_IDS = "demo"
"""Every demo answer (the fast set costs about one forward pass an answer)."""
DEFAULT_IDS = ("demo-01-lighthouse", "demo-04-mount-kelsey", "demo-08-library")
"""Demo answers the default set judges, with :data:`BUILTIN_ANSWERS` built-in ones."""
BUILTIN_ANSWERS = 2
TOLERANCE = 1e-4
"""Largest allowed change of a probability, a threshold or a span's score."""
TIMING = ("seconds", "set_id")
"""What a record holds that changes from run to run or machine to machine: its timing,
and the set id (it hashes the artifacts' folder and file times)."""


def default_examples() -> list[RAGExample]:
    demo = {e.id: e for e in builtin_examples()}
    return [demo[i] for i in DEFAULT_IDS] + resolve_dataset("builtin")[1][:BUILTIN_ANSWERS]


def fast_examples() -> list[RAGExample]:
    return [e for e in builtin_examples() if e.id.startswith(f"{FAST_IDS}-")]


def record(verdict_record: Mapping[str, Any]) -> dict[str, Any]:
    """A verdict record without what changes from run to run (:data:`TIMING`)."""
    return {k: v for k, v in verdict_record.items() if k not in TIMING}


def judged(model: LoadedModel, examples: Iterable[RAGExample], set_name: str) -> dict:
    dset = load_set(model.info.key, set_name)
    return {e.id: record(judge(model, e, dset).to_record()) for e in examples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=GOLDEN)
    args = p.parse_args(argv)
    model = load_model("embedded")
    out = {
        "fast": judged(model, fast_examples(), "fast"),
        "default": judged(model, default_examples(), DEFAULT_SET),
    }
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {args.out} ({sum(len(v) for v in out.values())} verdicts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
