"""Datasets: files on disk to validated examples, and source-grouped splits.

Files become :class:`~core.base.examples.RAGExample` lists.

Modules, from the bottom up (each imports only those below it; the format readers
never import each other):

* :mod:`core.data.records` -- :class:`LoadReport`, :class:`ColumnMapping`, bounded line
  reading (strict per-line JSONL and CSV), the collector applying ``on_error`` and
  ``limit``, and small field helpers.
* :mod:`core.data.spans` -- spans checked against the response; RAGTruth passages split
  and placed in the prompt.
* one module per format reader: :mod:`core.data.ragtruth` (``ragtruth_jsonl``),
  :mod:`core.data.ragtruth_pair` (``ragtruth_pair``), :mod:`core.data.interpdetect_format`
  (``interpdetect``), :mod:`core.data.generic` (``generic``) and
  :mod:`core.data.ragscope` (``ragscope``).
* :mod:`core.data.loader` -- :func:`load_dataset`, :func:`detect_format` and
  :func:`save_jsonl`.
* :mod:`core.data.catalog` -- :func:`resolve_dataset` (demo, builtin, builtin answers,
  ``shared:``/``stored:`` names, files, stored names) and the built-in corpus.
* :mod:`core.data.splits` -- source-grouped splits and data hashes.
* :mod:`core.data.sampling` -- the orders a dataset's answers are reviewed in (random,
  uncertainty, stratified), shared by the Review page and the learning curves.
"""

from core.data.catalog import (
    BUILTIN,
    BUILTIN_ANSWERS,
    BUILTIN_CORPUS_FILE,
    BUILTIN_REBUILD_COMMAND,
    BUILTIN_SPLITS,
    DEMO,
    DEMO_FULL,
    SHARED_PREFIX,
    STORED_PREFIX,
    builtin_answers_path,
    builtin_examples,
    demo_full_examples,
    is_named_spec,
    load_builtin,
    named_examples,
    resolve_dataset,
    resolve_datasets,
    shared_data_dir,
    stored_spec,
)
from core.data.loader import detect_format, load_dataset, save_jsonl
from core.data.records import (
    FORMATS,
    ColumnMapping,
    Format,
    LoadReport,
    OnError,
)
from core.data.sampling import (
    ORDERING_PURPOSE,
    STRATA,
    dataset_seed,
    next_to_scan,
    order_answers,
    random_order,
    to_rescan,
)
from core.data.spans import split_passages
from core.data.splits import (
    SPLITS,
    data_hash,
    make_splits,
    split_examples,
    stratified_head,
)

__all__ = [
    "ORDERING_PURPOSE",
    "STRATA",
    "dataset_seed",
    "next_to_scan",
    "order_answers",
    "random_order",
    "to_rescan",
    "BUILTIN",
    "BUILTIN_ANSWERS",
    "BUILTIN_CORPUS_FILE",
    "BUILTIN_REBUILD_COMMAND",
    "BUILTIN_SPLITS",
    "DEMO",
    "DEMO_FULL",
    "FORMATS",
    "SPLITS",
    "ColumnMapping",
    "Format",
    "LoadReport",
    "OnError",
    "builtin_answers_path",
    "builtin_examples",
    "data_hash",
    "demo_full_examples",
    "detect_format",
    "is_named_spec",
    "load_builtin",
    "load_dataset",
    "named_examples",
    "make_splits",
    "resolve_dataset",
    "resolve_datasets",
    "SHARED_PREFIX",
    "STORED_PREFIX",
    "save_jsonl",
    "shared_data_dir",
    "stored_spec",
    "split_examples",
    "split_passages",
    "stratified_head",
]
