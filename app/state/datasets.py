"""Datasets: the Home choices, reading them (cached), uploads; the Home page's widget keys."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import streamlit as st

from app.text import md
from core.base.errors import DataError, StorageError
from core.base.examples import RAGExample
from core.base.words import plural
from core.data import (
    BUILTIN_ANSWERS as BUILTIN_ANSWERS_SPEC,
)
from core.data import (
    DEMO,
    DEMO_FULL,
    SHARED_PREFIX,
    builtin_answers_path,
    builtin_examples,
    demo_full_examples,
    load_dataset,
    named_examples,
    shared_data_dir,
    stored_spec,
)
from core.storage import Store, default_db_path

if TYPE_CHECKING:
    import pandas as pd

    from core.base.examples import RAGExample
    from core.storage import Store


# Home
KEY_DATASET = "home.dataset"


KEY_UPLOAD = "home.upload"


KEY_UPLOAD_NAME = "home.upload_name"


KEY_IMPORT = "home.import"


SHARED_FILES: tuple[str, ...] = (
    "ragtruth_qa_dev.jsonl",
    "dolly_ac_dev.jsonl",
    "finqa_qwen3_interpdetect.jsonl",
)
"""The development sets offered when :func:`core.data.shared_data_dir` finds them."""


@dataclass(frozen=True, kw_only=True)
class DatasetRef:
    """Which dataset the Playground draws examples from.

    Attributes:
        kind: ``builtin`` (the shipped demo examples), ``shared`` (a development
            file in the shared data folder) or ``store`` (imported into the database).
        name: The dataset's name (file name for ``shared``).
        path: The file for ``shared``; the database file for ``store``.
        n_examples: How many examples it holds, when known (for labels).
    """

    kind: Literal["builtin", "shared", "store"]
    name: str
    path: str | None = None
    n_examples: int | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        n = (
            f" ({self.n_examples} {plural(self.n_examples, 'example')})"
            if self.n_examples is not None
            else ""
        )
        if self.kind == "builtin" and self.name == "answers":
            return f"Built-in: the embedded model's own answers (unlabelled){n}"
        if self.kind == "builtin" and self.name == DEMO_FULL:
            return f"Built-in demo, full: 72 hand-checked answers{n}"
        if self.kind == "builtin":
            return f"Built-in demo examples{n}"
        if self.kind == "shared":
            return f"Shared dev set: {self.name}{n}"
        return f"Imported: {self.name}{n}"

    @property
    def markdown_label(self) -> str:
        """:attr:`label` for widgets that render Markdown (radio options): the dataset's
        name, which the importer chose, escaped (:func:`app.text.md`)."""
        if self.kind in ("shared", "store"):
            return self.label.replace(self.name, md(self.name), 1)
        return self.label

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}:{self.path or ''}"

    @property
    def spec(self) -> str:
        """The dataset spec that reads it (:func:`core.data.resolve_dataset`), never a
        path: a stored dataset is ``stored:NAME`` whatever its name looks like (a name
        such as ``/srv/x.csv`` or ``demo`` must not open that file or that alias)."""
        if self.kind == "builtin":
            return {"answers": BUILTIN_ANSWERS_SPEC, DEMO_FULL: DEMO_FULL}.get(self.name, DEMO)
        if self.kind == "shared":
            return f"{SHARED_PREFIX}{Path(self.name).stem}"
        return stored_spec(self.name)


BUILTIN = DatasetRef(kind="builtin", name="demo")


BUILTIN_ANSWERS = DatasetRef(kind="builtin", name="answers")


DEMO_FULL_REF = DatasetRef(kind="builtin", name=DEMO_FULL)
"""The full demo (:func:`core.data.demo_full_examples`): :data:`BUILTIN` and 60 more."""

HOME_DATASET_ENV = "RAGSCOPE_HOME_DATASET"
"""``demo`` makes the quick 12-answer demo Home's dataset in a fresh session (the tests,
a one-minute tour); anything else, or nothing, the full demo."""


def home_default() -> DatasetRef:
    """Home's dataset in a fresh session: the full demo, sized for every page and loop,
    or the quick one when :data:`HOME_DATASET_ENV` says ``demo``."""
    return BUILTIN if os.environ.get(HOME_DATASET_ENV, "").strip() == DEMO else DEMO_FULL_REF


@st.cache_data(show_spinner="Reading the built-in examples…")
def _builtin_examples(full: bool = False) -> list[RAGExample]:
    """The demo's answers, each of the dataset its record names (core's
    :func:`~core.data.named_examples`, as on the command line)."""
    if full:
        return named_examples(demo_full_examples(), DEMO_FULL)
    return named_examples(builtin_examples(), DEMO)


@st.cache_data(show_spinner="Reading the dataset file…", max_entries=8)
def _file_examples(path: str, mtime: float, name: str) -> list[RAGExample]:
    """Examples of a dataset file (bad records skipped), each of the dataset its record
    names, else ``name`` (:func:`~core.data.named_examples`); ``mtime`` keys the cache."""
    return named_examples(load_dataset(path, on_error="skip").examples, name)


@st.cache_data(show_spinner="Reading the imported dataset…", max_entries=8)
def _stored_examples(db_path: str, name: str, created_at: str) -> list[RAGExample]:
    """Examples of a stored dataset, each of the dataset its record names, else the
    stored name (:func:`~core.data.named_examples`); ``created_at`` keys the cache
    (re-imports change it)."""
    return named_examples(_store(db_path).load_examples(name), name)


@st.cache_resource(show_spinner=False)
def _store(db_path: str) -> Store:

    return Store(db_path)


def get_store() -> Store:
    """The shared database (``RAGSCOPE_DB``, else in the cache dir)."""

    return _store(str(default_db_path()))


def dataset_choices() -> list[DatasetRef]:
    """Every dataset the app can offer: built-in, shared dev sets, imported ones.

    Raises:
        StorageError: The database cannot be opened.
    """

    out = [BUILTIN, DEMO_FULL_REF]
    if builtin_answers_path().is_file():
        out.append(BUILTIN_ANSWERS)
    shared = shared_data_dir()
    if shared is not None:
        for name in SHARED_FILES:
            p = shared / name
            if p.is_file():
                out.append(DatasetRef(kind="shared", name=name, path=str(p)))
    store = get_store()
    for info in store.list_datasets():
        out.append(
            DatasetRef(kind="store", name=info.name, path=store.path, n_examples=info.n_examples)
        )
    return out


def load_examples(ref: DatasetRef) -> list[RAGExample]:
    """The examples of ``ref`` (cached).

    Raises:
        DataError: The file is unreadable.
        StorageError: The stored dataset is gone.
    """
    if ref == BUILTIN_ANSWERS:
        path = builtin_answers_path()
        return _file_examples(str(path), path.stat().st_mtime, BUILTIN_ANSWERS_SPEC)
    if ref.kind == "builtin":
        return _builtin_examples(ref.name == DEMO_FULL)
    if ref.kind == "shared":
        assert ref.path is not None
        return _file_examples(ref.path, Path(ref.path).stat().st_mtime, Path(ref.path).stem)
    store = get_store()
    info = {d.name: d for d in store.list_datasets()}.get(ref.name)
    if info is None:
        raise StorageError(f"the imported dataset {ref.name!r} is no longer stored; pick another")
    return _stored_examples(store.path, ref.name, info.created_at)


@dataclass(frozen=True, kw_only=True)
class UploadReport:
    """An uploaded dataset file, read with bad records skipped.

    Attributes:
        file_name: The uploaded file's name.
        n_read: Records read (good and bad).
        examples: The good records (provenance names the upload, not a temp file).
        errors: ``(record, field, reason)`` per skipped record.
        warnings: Records that loaded with an adjustment.
        fmt: The format the file was read as.
    """

    file_name: str
    n_read: int
    examples: tuple[RAGExample, ...]
    errors: tuple[tuple[str, str, str], ...]
    warnings: tuple[str, ...]
    fmt: str

    @property
    def default_name(self) -> str:
        return Path(self.file_name).stem or "uploaded"

    def error_frame(self) -> pd.DataFrame:
        """The skipped records as a table: ``record``, ``field``, ``reason``."""
        import pandas as pd

        return pd.DataFrame(list(self.errors), columns=["record", "field", "reason"])


UPLOAD_SUFFIXES = (".jsonl", ".csv")


def upload_file_name(file_name: str) -> str:
    """A harmless local name for an uploaded file: its last path part, letters,
    digits, ``.``, ``-`` and ``_`` only, no leading dot, at most 80 characters, ending
    in ``.jsonl`` or ``.csv`` (the browser's name is only a hint; ``..``, ``/x`` or a
    500-character name must not reach the file system)."""
    import re

    base = re.split(r"[\\/]", str(file_name))[-1]
    suffix = Path(base).suffix.lower()
    suffix = suffix if suffix in UPLOAD_SUFFIXES else ".jsonl"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(base).stem).strip("._-")[:80]
    return f"{stem or 'upload'}{suffix}"


def read_upload(file_name: str, data: bytes) -> UploadReport:
    """Read an uploaded ``.jsonl``/``.csv`` with ``on_error="skip"``.

    The bytes go to a temporary file with a sanitised version of the upload's name
    (:func:`upload_file_name`; the loader detects the format from the name and
    content); record locations are reported as ``name:LINE``. Deliberately not cached
    across sessions: one visitor's upload never sits in a cache another can hit (the
    Home page keeps the report in its own session).

    Raises:
        DataError: The file as a whole is unreadable (empty, not UTF-8, unknown layout).
    """
    import tempfile
    from dataclasses import replace

    safe_name = upload_file_name(file_name)
    with tempfile.TemporaryDirectory(prefix="ragscope-upload-") as tmp:
        path = Path(tmp) / safe_name
        prefix = str(path)
        try:
            path.write_bytes(data)
            report = load_dataset(path, on_error="skip", dataset=path.stem)
        except DataError as e:
            raise DataError(str(e).replace(prefix, safe_name)) from e
        except OSError as e:
            raise DataError(f"the upload could not be read ({e.strerror or e})") from e

    def here(text: str | None) -> str:
        return (text or "").replace(prefix, safe_name)

    examples = tuple(
        replace(ex, provenance=replace(ex.provenance, source=here(ex.provenance.source)))
        for ex in report.examples
    )
    errors = tuple((here(e.source), e.field or "", here(e.reason)) for e in report.errors)
    return UploadReport(
        file_name=safe_name,
        n_read=report.n_read,
        examples=examples,
        errors=errors,
        warnings=tuple(here(w) for w in report.warnings),
        fmt=report.fmt,
    )
