"""Assemble, split, write and load the built-in labelled corpus.

Each task (``qa``, ``summary``, ``data2txt``) has its own templates (see
:mod:`tools.corpus.qa`, :mod:`tools.corpus.summary`, :mod:`tools.corpus.data2txt`). Document
``i`` of a task uses template ``i mod T`` with its own RNG seeded from
``(seed, group)``, and yields two examples: the faithful response and one hallucinated
variant. The variant's type is the one (among those the document supports) used least
so far in that task, so types stay balanced. Splits are assigned per source document
with a fixed 20-slot pattern (14 train, 3 validation, 3 test) running through each
task's documents in template order, so every template reaches every split.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import tools.corpus.data2txt as data2txt
import tools.corpus.qa as qa
import tools.corpus.summary as summary
from core.base.errors import DataError
from core.base.examples import Provenance, RAGExample
from core.base.paths import builtin_dir
from core.data import BUILTIN_CORPUS_FILE as CORPUS_FILE
from core.data import BUILTIN_REBUILD_COMMAND as REBUILD_COMMAND
from core.data import BUILTIN_SPLITS as SPLITS
from core.data import save_jsonl
from tools.corpus.compose import (
    HALLUCINATION_TYPES,
    TYPE_SLUGS,
    Doc,
    Gen,
    check_faithful,
    make_variant,
)

TemplateFn = Callable[[Gen], Doc]

DATASET = "builtin"
TASK_ORDER: tuple[str, ...] = ("qa", "summary", "data2txt")
DEFAULT_DOCS_PER_TASK = 300
MAX_CHARS = 1800
"""Upper bound on passages + question + response characters (about 450 tokens)."""
META_FILE = "corpus.meta.json"

_SPLIT_PATTERN: tuple[str, ...] = tuple(
    "validation" if k in (3, 10, 16) else "test" if k in (6, 13, 19) else "train" for k in range(20)
)


def templates(task: str) -> dict[str, TemplateFn]:
    """The templates of one task, in their fixed order (name -> function)."""

    table: dict[str, dict[str, TemplateFn]] = {
        "qa": qa.TEMPLATES,
        "summary": summary.TEMPLATES,
        "data2txt": data2txt.TEMPLATES,
    }
    if task not in table:
        raise DataError(
            f"the built-in corpus has no task {task!r}; use one of {', '.join(TASK_ORDER)}"
        )
    return table[task]


def template_ids(task: str | None = None) -> tuple[str, ...]:
    """Template ids as ``task/name`` (all tasks, or one)."""
    tasks = TASK_ORDER if task is None else (task,)
    return tuple(f"{t}/{name}" for t in tasks for name in templates(t))


def template_of(example: RAGExample) -> str:
    """The template id (``task/name``) an example was written from, read off its group.

    Raises:
        DataError: The example is not from the built-in corpus.
    """
    group = example.provenance.group or ""
    prefix = f"{DATASET}-{example.task}-"
    if not group.startswith(prefix):
        raise DataError(f"group {group!r} is not a built-in corpus group", source=example.id)
    return f"{example.task}/{group[len(prefix) :].rsplit('-', 1)[0]}"


def _example(
    group: str, task: str, doc: Doc, split: str, suffix: str, response: str, spans: tuple = ()
) -> RAGExample:
    htype = spans[0].type if spans else None
    return RAGExample(
        id=f"{group}-{suffix}",
        task=task,  # type: ignore[arg-type]
        question=doc.question,
        passages=doc.passages,
        response=response,
        label=bool(spans),
        spans=spans,
        provenance=Provenance(
            dataset=DATASET,
            generator="template" if htype is None else f"template+{TYPE_SLUGS[htype]}",
            split=split,
            group=group,
        ),
    )


def _task_docs(task: str, seed: int, n_docs: int) -> list[tuple[str, str, Doc, Any]]:
    """(template, group, doc, variant) per document of one task, in build order."""
    table = templates(task)
    names = list(table)
    seen: Counter[str] = Counter()
    used: Counter[str] = Counter()
    out = []
    for i in range(n_docs):
        name = names[i % len(names)]
        group = f"{DATASET}-{task}-{name}-{seen[name]:03d}"
        seen[name] += 1
        gen = Gen(random.Random(f"{seed}:{group}"), task)
        doc = table[name](gen)
        check_faithful(doc, group)
        # rotate the preferred type across rounds so no template is tied to one type
        start = (i + i // len(names)) % len(HALLUCINATION_TYPES)
        order = HALLUCINATION_TYPES[start:] + HALLUCINATION_TYPES[:start]
        variant = None
        for htype in sorted(order, key=lambda t: used[t]):  # stable: ties keep rotation order
            variant = make_variant(doc, htype, gen)
            if variant is not None:
                used[htype] += 1
                break
        if variant is None:
            raise AssertionError(f"{group}: the template offers no hallucination of any type")
        out.append((name, group, doc, variant))
    return out


def build_corpus(seed: int = 0, n_docs_per_task: int | None = None) -> list[RAGExample]:
    """Build the labelled corpus: per source document one faithful and one hallucinated example.

    Args:
        seed: Seeds every random choice; the same seed gives the same corpus.
        n_docs_per_task: Source documents per task (default 300, i.e. 1,800 examples).

    Returns:
        Examples ordered by task, then document (faithful first).
    """
    n = DEFAULT_DOCS_PER_TASK if n_docs_per_task is None else n_docs_per_task
    if n < 1:
        raise ValueError(f"n_docs_per_task must be at least 1, got {n}")
    out: list[RAGExample] = []
    for task in TASK_ORDER:
        docs = _task_docs(task, seed, n)
        # template-major order, shuffled within a template, then the split pattern
        rng = random.Random(f"{seed}:split:{task}")
        order = []
        for name in templates(task):
            block = [d[1] for d in docs if d[0] == name]
            rng.shuffle(block)
            order += block
        split_of = {g: _SPLIT_PATTERN[k % len(_SPLIT_PATTERN)] for k, g in enumerate(order)}
        for _name, group, doc, v in docs:
            split = split_of[group]
            faithful = _example(group, task, doc, split, "faithful", doc.faithful())
            halluc = _example(group, task, doc, split, TYPE_SLUGS[v.type], v.response, (v.span,))
            for ex in (faithful, halluc):
                size = sum(map(len, ex.passages)) + len(ex.question or "") + len(ex.response)
                if size > MAX_CHARS:
                    raise AssertionError(f"{ex.id}: {size} characters, over {MAX_CHARS}")
            out += [faithful, halluc]
    return out


def corpus_counts(examples: Iterable[RAGExample]) -> dict[str, Any]:
    """Counts by task, label, hallucination type and split (JSON-ready)."""
    exs = list(examples)

    def count(key: Callable[[RAGExample], str]) -> dict[str, int]:
        return dict(sorted(Counter(key(e) for e in exs).items()))

    def kind(e: RAGExample) -> str:
        return e.spans[0].type or "?" if e.spans else "faithful"

    return {
        "examples": len(exs),
        "documents": len({e.provenance.group for e in exs}),
        "by_task": count(lambda e: e.task),
        "by_label": count(lambda e: "hallucinated" if e.label else "faithful"),
        "by_type": {t: sum(kind(e) == t for e in exs) for t in HALLUCINATION_TYPES},
        "by_split": {s: sum(e.provenance.split == s for e in exs) for s in SPLITS},
        "by_task_type": {
            t: {
                k: sum(e.task == t and kind(e) == k for e in exs)
                for k in ("faithful", *HALLUCINATION_TYPES)
            }
            for t in TASK_ORDER
        },
        "by_task_split": {
            t: {s: sum(e.task == t and e.provenance.split == s for e in exs) for s in SPLITS}
            for t in TASK_ORDER
        },
        "templates": {t: len(templates(t)) for t in TASK_ORDER},
    }


def write_corpus(out_dir: Path | None = None, seed: int = 0) -> dict[str, Any]:
    """Build the corpus and write ``corpus.jsonl`` and ``corpus.meta.json`` into ``out_dir``.

    Args:
        out_dir: Destination folder (default ``assets/builtin``).
        seed: The build seed.

    Returns:
        The counts (see :func:`corpus_counts`) with the file path and its SHA-256.
    """
    out = Path(out_dir) if out_dir is not None else builtin_dir()
    examples = build_corpus(seed)
    path = save_jsonl(examples, out / CORPUS_FILE)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    counts = corpus_counts(examples)
    meta = {
        "name": DATASET,
        "description": "ragscope's built-in labelled RAG hallucination corpus (project-written templates)",
        "seed": seed,
        "docs_per_task": DEFAULT_DOCS_PER_TASK,
        "command": f"{REBUILD_COMMAND} --seed {seed}",
        "file": CORPUS_FILE,
        "sha256": digest,
        "counts": counts,
        "template_ids": list(template_ids()),
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return {**counts, "path": str(path), "sha256": digest}
