"""ragscope's built-in labelled RAG hallucination corpus.

Project-written templates (fictional entities, no text from any dataset) for the three
RAGTruth task types -- ``qa``, ``summary`` and ``data2txt`` -- each source document with
a faithful response and a hallucinated variant carrying one exact character span and
one of six types (see :data:`HALLUCINATION_TYPES`). Deterministic from a seed; split by
source document. The shipped copy is ``assets/builtin/corpus.jsonl`` (datasheet:
``assets/builtin/README.md``); rebuild it with ``python -m tools.corpus``.

Example:
    >>> from core.data import load_builtin
    >>> train = load_builtin("train")
"""

from __future__ import annotations

from core.base.paths import builtin_dir
from tools.corpus.build import (
    CORPUS_FILE,
    DEFAULT_DOCS_PER_TASK,
    MAX_CHARS,
    SPLITS,
    TASK_ORDER,
    build_corpus,
    corpus_counts,
    template_ids,
    template_of,
    templates,
    write_corpus,
)
from tools.corpus.compose import HALLUCINATION_TYPES, TYPE_SLUGS

__all__ = [
    "CORPUS_FILE",
    "DEFAULT_DOCS_PER_TASK",
    "HALLUCINATION_TYPES",
    "MAX_CHARS",
    "SPLITS",
    "TASK_ORDER",
    "TYPE_SLUGS",
    "build_corpus",
    "builtin_dir",
    "corpus_counts",
    "template_ids",
    "template_of",
    "templates",
    "write_corpus",
]
