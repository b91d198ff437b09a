"""The one place for the app's cached resources, cached computations and session state.

- Resources (``st.cache_resource``): the model (shared by every session; its own lock
  guards forward passes) and the SQLite store.
- Resources (``st.cache_resource``) also hold the fitted detectors shipped for the
  loaded model (keyed by its ``ModelInfo.key`` and the artifact files' stamps).
- Pure computations (``st.cache_data``): dataset files read into examples, the
  analysis of one example (render -> trace -> surprisal) and the shipped detectors'
  verdicts on it. None of them reads ``st.session_state``; everything they depend on
  is an argument.
- Session state: one :class:`AppState` object per session, from :func:`app_state`.
  Widget keys are the ``KEY_*`` constants below; tests use the same names.

The model spec comes from the environment: ``RAGSCOPE_MODEL`` (default
``embedded``; tests use ``tiny``) and ``RAGSCOPE_DEVICE`` (default ``auto``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import streamlit as st

from app.text import md
from core.contract import Run, artifact_info
from core.datasets import (
    builtin_answers_path,
    builtin_examples,
    load_builtin,
    load_dataset,
    resolve_dataset,
    shared_data_dir,
)
from core.detectors import available_detectors, load_shipped, make_detector, shipped_artifacts
from core.errors import DataError, ModelError, RagscopeError, StorageError
from core.evaluate import EvalRun, list_runs
from core.examples import RAGExample
from core.explain import feature_examples
from core.extract import FeatureCache, extract_features, run_example
from core.headstats import HeadStats, head_view
from core.layout import render
from core.model import load_model
from core.paths import repo_root, runs_dir, shipped_dir, shipped_runs_dir
from core.shapviz import shap_values
from core.smoothing import P_STAY_TOKEN
from core.spad import response_pos
from core.splits import stratified_head
from core.storage import Store, default_db_path
from core.trace import response_needs, token_surprisal, trace

if TYPE_CHECKING:
    import pandas as pd

    from core.contract import Detector, Features, Verdict
    from core.counterfactual import Counterfactual
    from core.evaluate import EvalRun
    from core.examples import RAGExample
    from core.explain import FeatureExamples, FidelityResult
    from core.headstats import HeadStats, HeadView
    from core.layout import Layout
    from core.model import LoadedModel
    from core.sae import LoadedSAE
    from core.shapviz import ShapResult
    from core.spad import TokenSources
    from core.storage import Store

# --------------------------------------------------------------------------- keys

STATE_KEY = "ragscope.state"

# Home
KEY_DATASET = "home.dataset"
KEY_UPLOAD = "home.upload"
KEY_UPLOAD_NAME = "home.upload_name"
KEY_IMPORT = "home.import"

# Playground: the input
KEY_INPUT_MODE = "playground.input_mode"
KEY_EXAMPLE = "playground.example"
KEY_OWN_TASK = "playground.own.task"
KEY_OWN_QUESTION = "playground.own.question"
KEY_ADD_PASSAGE = "playground.own.add_passage"
# Playground: the answer
KEY_ANSWER_SOURCE = "playground.answer_source"
KEY_MAX_TOKENS = "playground.max_tokens"
KEY_TEMPERATURE = "playground.temperature"
KEY_GENERATE = "playground.generate"
KEY_PASTED = "playground.pasted"
KEY_ANALYSE = "playground.analyse"
# Playground: the results
KEY_COLOR_BY = "playground.color_by"

COLOR_SURPRISAL = "surprisal"
"""The "Colour tokens by" choice meaning the model's own surprisal (else a detector name)."""

INPUT_DATASET = "An example from the dataset"
INPUT_OWN = "Write your own"
INPUT_MODES: tuple[str, ...] = (INPUT_DATASET, INPUT_OWN)

# Benchmark: saved runs
KEY_BENCH_RUNS = "benchmark.runs"
KEY_BENCH_BREAKDOWN_METRIC = "benchmark.breakdown_metric"
KEY_BENCH_CONFUSION = "benchmark.confusion_detector"
# Benchmark: a new run
KEY_BENCH_TRAIN = "benchmark.new.train"
KEY_BENCH_TEST = "benchmark.new.test"
KEY_BENCH_DETECTORS = "benchmark.new.detectors"
KEY_BENCH_LIMIT = "benchmark.new.limit"
KEY_BENCH_LAUNCH = "benchmark.new.launch"

SAME_DATASET = ""
"""The Benchmark's test-dataset choice meaning "the train dataset's own test split"."""

# Heads & layers: copying heads
KEY_HEADS_TOP = "heads.copying.top"
# Heads & layers: faithful vs hallucinated statistics
KEY_HEADS_SOURCE = "heads.stats.source"
KEY_HEADS_SPLIT = "heads.stats.split"
KEY_HEADS_LIMIT = "heads.stats.limit"
KEY_HEADS_UNIT = "heads.stats.unit"
KEY_HEADS_COMPUTE = "heads.stats.compute"
# Heads & layers: one answer, one head
KEY_HEADS_EXAMPLE_SOURCE = "heads.example.source"
KEY_HEADS_EXAMPLE = "heads.example.id"
KEY_HEADS_LAYER = "heads.example.layer"
KEY_HEADS_HEAD = "heads.example.head"

# SHAP summary
KEY_SHAP_SOURCE = "shap.source"
KEY_SHAP_SPLIT = "shap.split"
KEY_SHAP_LIMIT = "shap.limit"
KEY_SHAP_COMPUTE = "shap.compute"
KEY_SHAP_QUICK_FIT = "shap.quick_fit"
KEY_SHAP_TOP = "shap.top"
KEY_SHAP_GRID = "shap.grid"
# Token sources
KEY_TOKENS_EXAMPLE_SOURCE = "tokens.example.source"
KEY_TOKENS_DATASET = "tokens.dataset"
KEY_TOKENS_EXAMPLE = "tokens.example.id"
KEY_TOKENS_BY_POS = "tokens.by_pos"
KEY_TOKENS_QUICK_FIT = "tokens.quick_fit"
# Feature explanations
KEY_EXPLAIN_SOURCE = "explain.source"
KEY_HEATMAP_SOURCE = "heatmaps.example.source"
KEY_HEATMAP_DATASET = "heatmaps.dataset"
KEY_HEATMAP_EXAMPLE = "heatmaps.example.id"
KEY_CF_SOURCE = "cf.example.source"
KEY_CF_DATASET = "cf.dataset"
KEY_CF_EXAMPLE = "cf.example.id"
KEY_EXPLAIN_SPLIT = "explain.split"
KEY_EXPLAIN_LIMIT = "explain.limit"
KEY_EXPLAIN_READ = "explain.read"
KEY_EXPLAIN_FEATURES = "explain.features"
KEY_EXPLAIN_IDS = "explain.ids"
KEY_EXPLAIN_TOP_N = "explain.top_n"
KEY_EXPLAIN_RUN = "explain.run"
KEY_EXPLAIN_STOP = "explain.stop"

HEADS_FROM_HOME = "home"
"""The Heads & layers examples choice meaning "the dataset picked on Home"."""
HEADS_FROM_CORPUS = "corpus"
"""The Heads & layers examples choice meaning "the built-in labelled corpus"."""
ALL_SPLITS = "all"
"""The Heads & layers split choice meaning "every example, whatever its split"."""
HEADS_UNITS: tuple[str, ...] = ("response", "chunk")
"""Units the statistics count: answers (response vectors) or answer sentences."""
HEADS_EXAMPLE_DATASET = "dataset"
HEADS_EXAMPLE_PLAYGROUND = "playground"

ANSWER_GENERATE = "Let the model write the answer"
ANSWER_PASTE = "Paste an answer"
ANSWER_SOURCES: tuple[str, ...] = (ANSWER_GENERATE, ANSWER_PASTE)


def passage_key(pid: int) -> str:
    """Widget key of the text area of own-example passage ``pid``."""
    return f"playground.own.passage.{pid}"


def remove_passage_key(pid: int) -> str:
    """Widget key of the remove button of own-example passage ``pid``."""
    return f"playground.own.remove.{pid}"


def explain_one_key(feature: int) -> str:
    """Widget key of the Feature explanations page's "Explain" button of one feature."""
    return f"explain.one.{feature}"


def fidelity_key(feature: int) -> str:
    """Widget key of the Feature explanations page's "Check fidelity" button of one feature."""
    return f"explain.fidelity.{feature}"


def threshold_key(run: str, detector: str) -> str:
    """Widget key of the Benchmark's threshold slider for ``detector`` in run ``run``.

    One key per run and detector, so each slider starts at that detector's validation
    threshold and remembers where it was moved to.
    """
    return f"benchmark.threshold.{run}.{detector}"


# --------------------------------------------------------------------------- model

MODEL_ENV = "RAGSCOPE_MODEL"
DEVICE_ENV = "RAGSCOPE_DEVICE"


def model_spec() -> str:
    """The model to load: env ``RAGSCOPE_MODEL`` (default ``embedded``)."""
    return os.environ.get(MODEL_ENV, "").strip() or "embedded"


def model_device() -> str:
    """The device to load on: env ``RAGSCOPE_DEVICE`` (default ``auto``)."""
    return os.environ.get(DEVICE_ENV, "").strip() or "auto"


class ModelLoader:
    """Loads one model on a background thread and reports progress.

    The script thread polls it to draw a progress bar; every session asking for the
    same model while it loads watches the same load.
    """

    def __init__(self, spec: str, device: str) -> None:
        self.spec = spec
        self.device = device
        self.message = f"Loading {spec}"
        self.fraction = 0.0
        self.model: LoadedModel | None = None
        self.error: Exception | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ragscope-load-{spec}", daemon=True)
        self._thread.start()

    def _progress(self, message: str, fraction: float) -> None:
        self.message = message
        self.fraction = min(max(float(fraction), 0.0), 1.0)

    def _run(self) -> None:

        try:
            model = load_model(self.spec, device=self.device, progress=self._progress)
            self._progress("Warming up (first forward pass)", 0.97)
            _warm_up(model)
            self.model = model
        except Exception as e:  # handed to the script thread, which shows it
            self.error = e
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds; True once loading has finished (or failed)."""
        return self._done.wait(timeout)


def _warm_up(model: LoadedModel) -> None:
    """Trace a tiny example once, so the first user's first analysis is not the slow one.

    The first forward pass after loading pages the weights in and sets up kernels (about
    10 s for the embedded model on a small CPU machine); later passes take well under 1 s.
    """

    example = RAGExample(
        id="warm-up", question="Who?", passages=("Ada built it.",), response="Ada."
    )
    trace(model, render(example, model), response_needs())


@st.cache_resource(show_spinner=False, max_entries=2)
def _model_loader(spec: str, device: str) -> ModelLoader:
    return ModelLoader(spec, device)


def get_model() -> LoadedModel:
    """The shared model for ``RAGSCOPE_MODEL`` / ``RAGSCOPE_DEVICE``.

    The first call in the process starts the load and shows its progress; later calls
    return at once. A :class:`~core.errors.ModelError` is shown with ``st.error`` (its
    message names the fix) and the script stops; the next rerun tries again.
    """
    spec, device = model_spec(), model_device()
    loader = _model_loader(spec, device)
    if not loader.done:
        slot = st.empty()
        with slot.status(f"Loading the model `{spec}`…", expanded=True) as status:
            bar = st.progress(loader.fraction, text=loader.message)
            while not loader.wait(0.25):
                bar.progress(loader.fraction, text=loader.message)
            if loader.error is not None:
                status.update(label="The model could not be loaded", state="error")
        if loader.error is None:
            slot.empty()
    if loader.error is not None or loader.model is None:
        err = loader.error
        _model_loader.clear(spec, device)  # a fixed install works on the next rerun
        if isinstance(err, ModelError):
            st.error(f"The model `{spec}` could not be loaded: {err}")
            st.stop()
        raise err if err is not None else ModelError(f"loading {spec!r} returned nothing")
    return loader.model


# --------------------------------------------------------------------------- datasets

SHARED_FILES: tuple[str, ...] = (
    "ragtruth_qa_dev.jsonl",
    "dolly_ac_dev.jsonl",
    "finqa_qwen3_interpdetect.jsonl",
)
"""The development sets offered when :func:`core.datasets.shared_data_dir` finds them."""


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
        n = f" ({self.n_examples} examples)" if self.n_examples is not None else ""
        if self.kind == "builtin" and self.name == "answers":
            return f"Built-in: the embedded model's own answers (unlabelled){n}"
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


BUILTIN = DatasetRef(kind="builtin", name="demo")
BUILTIN_ANSWERS = DatasetRef(kind="builtin", name="answers")


@st.cache_data(show_spinner="Reading the built-in examples…")
def _builtin_examples() -> list[RAGExample]:

    return builtin_examples()


@st.cache_data(show_spinner="Reading the dataset file…", max_entries=8)
def _file_examples(path: str, mtime: float) -> list[RAGExample]:
    """Examples of a dataset file (bad records skipped); ``mtime`` keys the cache."""

    return list(load_dataset(path, on_error="skip").examples)


@st.cache_data(show_spinner="Reading the imported dataset…", max_entries=8)
def _stored_examples(db_path: str, name: str, created_at: str) -> list[RAGExample]:
    """Examples of a stored dataset; ``created_at`` keys the cache (re-imports change it)."""
    return _store(db_path).load_examples(name)


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

    out = [BUILTIN]
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
        return _file_examples(str(path), path.stat().st_mtime)
    if ref.kind == "builtin":
        return _builtin_examples()
    if ref.kind == "shared":
        assert ref.path is not None
        return _file_examples(ref.path, Path(ref.path).stat().st_mtime)
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


# --------------------------------------------------------------------------- evaluation runs


@st.cache_data(show_spinner=False, max_entries=64)
def _read_run(path: str, mtime: float) -> EvalRun:
    """One saved run; ``mtime`` keys the cache (a re-saved run is read again)."""

    return EvalRun.load(path)


@dataclass(frozen=True, kw_only=True, eq=False)
class SavedRuns:
    """The runs saved in the runs folder, then those shipped with ragscope.

    Attributes:
        folder: Where this machine's runs are read from (and new runs saved).
        runs: Run name -> run: this machine's newest first, then the shipped ones
            by name (a local run shadows a shipped one of the same name).
        shipped: Names of the runs that came from ``shipped_folder``.
        shipped_folder: Where the shipped runs live (``assets/runs``).
        unreadable: ``(file name, reason)`` per JSON file that is not a readable run.
    """

    folder: Path
    runs: dict[str, EvalRun]
    shipped: frozenset[str] = frozenset()
    shipped_folder: Path | None = None
    unreadable: tuple[tuple[str, str], ...] = ()


def saved_runs() -> SavedRuns:
    """This machine's runs (:func:`core.evaluate.runs_dir`) and the shipped ones."""

    folder, shipped_folder = runs_dir(), shipped_runs_dir()
    runs: dict[str, EvalRun] = {}
    shipped: set[str] = set()
    bad: list[tuple[str, str]] = []
    local_paths = list_runs(folder)
    ship_paths = sorted(list_runs(shipped_folder)) if shipped_folder != folder else []
    for path in [*local_paths, *ship_paths]:
        try:
            run = _read_run(str(path), path.stat().st_mtime)
        except (DataError, OSError) as e:
            bad.append((path.name, str(e)))
            continue
        if run.name not in runs:
            runs[run.name] = run
            if path in ship_paths:
                shipped.add(run.name)
    return SavedRuns(
        folder=folder,
        runs=runs,
        shipped=frozenset(shipped),
        shipped_folder=shipped_folder,
        unreadable=tuple(bad),
    )


CORPUS = "builtin"
"""Spec of the built-in labelled corpus (see :func:`core.datasets.resolve_dataset`)."""


def eval_dataset_choices() -> dict[str, str]:
    """Dataset spec -> label, for the Benchmark's new-run pickers.

    The demo examples and the built-in corpus, the shared dev sets (their paths) and the
    imported datasets (their names). Whether a spec can be read is up to
    :func:`dataset_summary`.

    Raises:
        StorageError: The database cannot be opened.
    """
    out = {"demo": "Demo examples (12, hand-written)", CORPUS: "Built-in labelled corpus"}
    for ref in dataset_choices():
        if ref.kind == "shared":
            assert ref.path is not None
            out[ref.path] = ref.label
        elif ref.kind == "store":
            out[ref.name] = ref.label
    return out


@dataclass(frozen=True, kw_only=True)
class DatasetSummary:
    """What a dataset spec holds, for the new-run form.

    Attributes:
        name: The name a run records for it.
        n: Examples.
        n_hallucinated: Examples labelled hallucinated.
        n_faithful: Examples labelled faithful.
    """

    name: str
    n: int
    n_hallucinated: int
    n_faithful: int

    @property
    def n_unlabelled(self) -> int:
        return self.n - self.n_hallucinated - self.n_faithful


@st.cache_data(show_spinner="Reading the dataset…", ttl=60, max_entries=16)
def dataset_summary(spec: str) -> DatasetSummary:
    """Counts of a dataset spec (cached for a minute: files and the database can change).

    Raises:
        DataError: The dataset cannot be read (for ``builtin``: the corpus is not built).
        StorageError: The database cannot be opened.
    """

    name, examples = resolve_dataset(spec, on_error="skip")
    return DatasetSummary(
        name=name,
        n=len(examples),
        n_hallucinated=sum(1 for e in examples if e.label is True),
        n_faithful=sum(1 for e in examples if e.label is False),
    )


# --------------------------------------------------------------------------- analysis


@dataclass(frozen=True, kw_only=True, eq=False)
class Analysis:
    """What the Playground shows for one analysed answer.

    Attributes:
        example: The example as analysed (its response is the analysed answer).
        layout: The token layout the model read.
        surprisal: Bits per response token, shape ``[resp]``.
        trace_seconds: Wall time of the forward pass.
        answer_source: ``dataset``, ``pasted`` or ``generated``.
        model_name: Display name of the analysing model.
        signature: :func:`input_signature` of the input, to tell when it is stale.
    """

    example: RAGExample
    layout: Layout
    surprisal: np.ndarray
    trace_seconds: float
    answer_source: str
    model_name: str
    signature: str

    @property
    def labels(self) -> np.ndarray | None:
        return self.layout.token_labels()

    def token_frame(self) -> pd.DataFrame:
        """Every position of the layout, with surprisal (and gold) for answer tokens."""
        df = self.layout.to_frame()
        surprisal = np.full(len(df), np.nan, dtype=np.float64)
        pos = self.layout.response_positions
        surprisal[pos] = self.surprisal
        df["surprisal_bits"] = surprisal
        labels = self.labels
        if labels is not None:
            gold = np.full(len(df), "", dtype=object)
            gold[pos] = np.where(labels == 1, "hallucinated", "faithful")
            df["gold"] = gold
        return df


def input_signature(example: RAGExample, response_ids: Sequence[int] | None) -> str:
    """A content hash of an analysis input (example fields + the answer's token ids)."""
    payload = json.dumps(
        [example.to_dict(), list(response_ids) if response_ids is not None else None],
        ensure_ascii=False,
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


@st.cache_data(show_spinner=False, max_entries=64)
def _analyse_cached(
    _model: LoadedModel,
    model_id: str,
    _example: RAGExample,
    signature: str,
    response_ids: tuple[int, ...] | None,
) -> tuple[Layout, np.ndarray, float]:
    """render -> trace -> surprisal; keyed by ``model_id`` and ``signature``."""

    layout = render(_example, _model, response_ids=response_ids)
    tr = trace(_model, layout, response_needs())
    return layout, token_surprisal(tr), tr.seconds


def analyse(
    model: LoadedModel,
    example: RAGExample,
    *,
    response_ids: Sequence[int] | None = None,
    answer_source: str = "pasted",
) -> Analysis:
    """Analyse ``example``'s response with ``model`` (cached per model and input).

    Raises:
        DataError: The example cannot be laid out (too long, bad response ids, ...).
        ModelError: The forward pass failed.
    """
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    sig = input_signature(example, ids)
    layout, surprisal, seconds = _analyse_cached(model, model.instance_key, example, sig, ids)
    return Analysis(
        example=example,
        layout=layout,
        surprisal=surprisal,
        trace_seconds=seconds,
        answer_source=answer_source,
        model_name=model.info.display_name,
        signature=sig,
    )


# --------------------------------------------------------------------------- detectors


@dataclass(frozen=True, kw_only=True, eq=False)
class ShippedDetector:
    """A fitted detector loaded from a shipped artifact, with what its ``cfg.json`` says.

    Attributes:
        name: Detector name (also the artifact's folder name).
        folder: The artifact folder.
        detector: The fitted detector.
        threshold: Score at or above which the detector flags an answer.
        trained_on: Name of the dataset it was trained on, when recorded.
        n_train: Training examples, when recorded.
        test_auroc: AUROC on the held-out test split, when recorded and defined.
    """

    name: str
    folder: Path
    detector: Detector
    threshold: float
    trained_on: str | None
    n_train: int | None
    test_auroc: float | None


@dataclass(frozen=True, kw_only=True)
class BrokenArtifact:
    """A shipped artifact folder that could not be loaded.

    Attributes:
        name: Detector name (the folder's name).
        folder: The artifact folder.
        reason: Why loading failed.
    """

    name: str
    folder: Path
    reason: str


@dataclass(frozen=True, kw_only=True, eq=False)
class ShippedDetectors:
    """The shipped detectors for one model, as found in one artifacts folder.

    Attributes:
        folder: Where the artifacts were looked for (:func:`core.detectors.shipped_dir`).
        model_key: ``ModelInfo.key`` of the model they were loaded for.
        detectors: The loaded detectors trained on that model, by name.
        broken: Artifacts that could not be read or loaded.
        other_models: Model keys that the readable artifacts of other models were made for.
        stamp: :func:`_artifacts_stamp` of the folder when they were loaded.
    """

    folder: Path
    model_key: str
    detectors: tuple[ShippedDetector, ...]
    broken: tuple[BrokenArtifact, ...]
    other_models: tuple[str, ...]
    stamp: str

    @property
    def cache_id(self) -> str:
        """Identifies this set of detectors, for the verdict cache."""
        return f"{self.model_key}|{self.folder}|{self.stamp}"


def _artifacts_stamp(root: Path) -> str:
    """Changes whenever an artifact file under ``root`` is added, removed or rewritten."""
    parts: list[str] = []
    for path in sorted(root.glob("*/*.json")) if root.is_dir() else ():
        try:
            stat = path.stat()
        except OSError:  # removed while listing: the next rerun sees the new state
            continue
        parts.append(f"{path.relative_to(root)}:{stat.st_mtime_ns}:{stat.st_size}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def _cfg_value(cfg: dict[str, Any], *path: str) -> object:
    """``cfg[path[0]][path[1]]...``, or ``None`` where a level is missing."""
    node: object = cfg
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _artifact_cfg(folder: Path) -> dict[str, Any]:
    """An artifact's ``cfg.json``, or ``{}`` when it cannot be read."""

    try:
        return artifact_info(folder)
    except DataError:
        return {}


def _shipped_detector(name: str, folder: Path, detector: Detector) -> ShippedDetector:
    """Wrap a loaded detector with the facts of its ``cfg.json``."""
    cfg = _artifact_cfg(folder)
    dataset = _cfg_value(cfg, "trained_on", "dataset")
    n_train = _cfg_value(cfg, "trained_on", "n", "train")
    if n_train is None:
        n_train = _cfg_value(cfg, "train", "n_train")
    auroc = _cfg_value(cfg, "metrics", "test", "auroc")
    threshold = getattr(detector, "threshold_", None)
    if threshold is None:
        threshold = _cfg_value(cfg, "threshold")
    return ShippedDetector(
        name=name,
        folder=folder,
        detector=detector,
        threshold=float(threshold) if isinstance(threshold, int | float) else 0.5,
        trained_on=str(dataset) if dataset is not None else None,
        n_train=int(n_train) if isinstance(n_train, int | float) else None,
        test_auroc=float(auroc) if isinstance(auroc, int | float) else None,
    )


@st.cache_resource(show_spinner="Loading the trained detectors…", max_entries=8)
def _shipped_detectors(model_key: str, folder: str, stamp: str) -> ShippedDetectors:
    """Load every artifact in ``folder`` made for ``model_key``; ``stamp`` keys the cache."""

    root = Path(folder)
    readable = shipped_artifacts(folder=root)
    matching = shipped_artifacts(model_key, folder=root)
    loaded: list[ShippedDetector] = []
    broken: list[BrokenArtifact] = []
    registered = set(available_detectors())
    for sub in sorted(root.iterdir()) if root.is_dir() else ():
        if sub.name in registered and sub.name not in readable and (sub / "cfg.json").exists():
            broken.append(
                BrokenArtifact(name=sub.name, folder=sub, reason="its cfg.json cannot be read")
            )
    for name, path in matching.items():
        try:
            loaded.append(_shipped_detector(name, path, load_shipped(name, model_key, root)))
        except RagscopeError as e:
            broken.append(BrokenArtifact(name=name, folder=path, reason=str(e)))
        except (KeyError, TypeError, ValueError) as e:
            # Well-formed JSON with the wrong content: the loaders index into it directly.
            reason = f"malformed artifact ({type(e).__name__}: {e})"
            broken.append(BrokenArtifact(name=name, folder=path, reason=reason))
    models = {_cfg_value(_artifact_cfg(path), "model") for path in readable.values()}
    return ShippedDetectors(
        folder=root,
        model_key=model_key,
        detectors=tuple(loaded),
        broken=tuple(sorted(broken, key=lambda b: b.name)),
        other_models=tuple(sorted(str(m) for m in models if m and m != model_key)),
        stamp=stamp,
    )


def shipped_detectors(model: LoadedModel) -> ShippedDetectors:
    """The shipped detectors trained on ``model`` (cached; reloaded when the files change).

    Artifacts come from :func:`core.detectors.shipped_dir` (``RAGSCOPE_DETECTORS_DIR``,
    else ``assets/detectors``). A broken artifact does not raise: it is listed in
    :attr:`ShippedDetectors.broken` and the others still load.
    """

    root = shipped_dir()
    return _shipped_detectors(model.info.key, str(root), _artifacts_stamp(root))


@dataclass(frozen=True, kw_only=True, eq=False)
class DetectorVerdicts:
    """The shipped detectors' verdicts on one analysed answer.

    Attributes:
        signature: :func:`input_signature` of the analysed input.
        detectors: The detectors that judged it.
        verdicts: One verdict per detector, aligned with ``detectors``.
        seconds: Wall time of the shared trace and the predictions (when first computed).
        features: Detector name -> the features its verdict was computed from.
    """

    signature: str
    detectors: tuple[ShippedDetector, ...]
    verdicts: tuple[Verdict, ...]
    seconds: float
    features: Mapping[str, Features] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert len(self.detectors) == len(self.verdicts), "one verdict per detector"

    def with_token_scores(self) -> dict[str, Verdict]:
        """Detector name -> verdict, for the detectors that score single tokens."""
        return {
            v.detector: v
            for v in self.verdicts
            if v.token_scores is not None and v.token_offsets is not None
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per detector: ``detector``, ``score``, ``threshold``, ``verdict``,
        ``trained on``, ``n train``, ``test AUROC`` (missing facts are empty)."""
        import pandas as pd

        rows = []
        for d, v in zip(self.detectors, self.verdicts, strict=True):
            flagged = v.hallucinated if v.hallucinated is not None else v.score >= d.threshold
            rows.append(
                {
                    "detector": d.name,
                    "score": v.score,
                    "threshold": d.threshold,
                    "verdict": "flagged" if flagged else "not flagged",
                    "trained on": d.trained_on,
                    "n train": d.n_train,
                    "test AUROC": d.test_auroc,
                }
            )
        columns = ["detector", "score", "threshold", "verdict", "trained on", "n train"]
        frame = pd.DataFrame(rows, columns=[*columns, "test AUROC"])
        return frame.astype({"n train": "Int64", "test AUROC": "Float64"})


@st.cache_data(show_spinner="Running the detectors…", max_entries=64)
def _verdicts_cached(
    _model: LoadedModel,
    model_id: str,
    _example: RAGExample,
    signature: str,
    _detectors: tuple[Detector, ...],
    detectors_id: str,
) -> tuple[tuple[Verdict, ...], float, dict[str, Features]]:
    """One shared trace -> features -> verdicts; keyed by model, input and detector set."""
    import time

    t0 = time.perf_counter()
    features = run_example(_model, _example, list(_detectors))
    verdicts = tuple(d.predict(features[d.name]) for d in _detectors)
    return verdicts, time.perf_counter() - t0, features


def detector_verdicts(
    model: LoadedModel, analysis: Analysis, shipped: ShippedDetectors
) -> DetectorVerdicts:
    """Every loaded shipped detector's verdict on ``analysis``'s answer (cached).

    The example is traced once for all of them (:func:`core.extract.run_example`).

    Raises:
        DataError: The example cannot be laid out for the detectors.
        ModelError: A detector cannot run (missing trace, spaCy model, other model).
    """
    dets = tuple(s.detector for s in shipped.detectors)
    verdicts, seconds, features = (
        _verdicts_cached(
            model, model.instance_key, analysis.example, analysis.signature, dets, shipped.cache_id
        )
        if dets
        else ((), 0.0, {})
    )
    return DetectorVerdicts(
        signature=analysis.signature,
        detectors=shipped.detectors,
        verdicts=verdicts,
        seconds=seconds,
        features=features,
    )


def align_token_scores(
    scores: np.ndarray, offsets: np.ndarray, target_offsets: np.ndarray
) -> np.ndarray:
    """Carry token scores onto another tokenization of the same text.

    A detector re-renders the answer from its text, so a generated answer's own tokens
    may be split differently; each target token takes the highest score of the source
    tokens its characters overlap (NaN when none does).

    Args:
        scores: ``[n_src]`` scores.
        offsets: ``[n_src, 2]`` character ranges of the scored tokens.
        target_offsets: ``[n_tgt, 2]`` character ranges to score.

    Returns:
        ``[n_tgt]`` float64 scores.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    src = np.asarray(offsets).reshape(-1, 2)
    tgt = np.asarray(target_offsets).reshape(-1, 2)
    if src.shape[0] != s.shape[0]:
        raise ValueError(f"{s.shape[0]} scores for {src.shape[0]} token offsets")
    if src.shape == tgt.shape and np.array_equal(src, tgt):
        return s.copy()
    overlap = (src[None, :, 0] < tgt[:, None, 1]) & (tgt[:, None, 0] < src[None, :, 1])
    out = np.where(overlap, s[None, :], -np.inf).max(axis=1, initial=-np.inf)
    return np.where(np.isfinite(out), out, np.nan)


# --------------------------------------------------------------------------- heads & layers

REDEEP_DETECTORS: tuple[str, ...] = ("redeep_token", "redeep_chunk")
"""The shipped detectors the Heads & layers page reads (when trained for the model)."""


@st.cache_data(show_spinner="Reading the built-in labelled corpus…")
def _corpus_examples() -> list[RAGExample]:

    return load_builtin()


REVIEW_CORPUS_KEY = "corpus"


def review_key(ref: DatasetRef | None) -> str:
    """The review queue's name of a dataset (``None``: the built-in labelled corpus)."""
    return REVIEW_CORPUS_KEY if ref is None else f"{ref.kind}:{ref.name}"


def heads_examples(source: str, home: DatasetRef) -> tuple[str, str, list[RAGExample]]:
    """``(dataset key, label, examples)`` of the Heads & layers page's examples choice.

    Args:
        source: :data:`HEADS_FROM_HOME` (the dataset picked on Home) or
            :data:`HEADS_FROM_CORPUS` (the built-in labelled corpus).
        home: The dataset picked on Home.

    Raises:
        DataError: The corpus or the dataset file cannot be read.
        StorageError: The imported dataset is gone.
    """
    if source == HEADS_FROM_CORPUS:
        return f"corpus:{CORPUS}", "Built-in labelled corpus", _corpus_examples()
    return home.key, home.label, load_examples(home)


def example_splits(examples: Sequence[RAGExample]) -> list[str]:
    """:data:`ALL_SPLITS` and the splits the examples declare (train, validation, test first)."""
    order = {"train": 0, "validation": 1, "test": 2}
    found = {e.provenance.split for e in examples if e.provenance.split}
    return [ALL_SPLITS, *sorted(found, key=lambda s: (order.get(s, 3), s))]


def stats_examples(examples: Sequence[RAGExample], split: str, n: int) -> list[RAGExample]:
    """At most ``n`` labelled examples of ``split``, whole sources together (deterministic).

    Whole sources keep each faithful answer next to its hallucinated variant where a
    dataset has both (the built-in corpus), so both classes show up in a small sample.
    """

    pool = [e for e in examples if split == ALL_SPLITS or e.provenance.split == split]
    labelled = [e for e in pool if e.label is not None]
    return stratified_head(labelled or pool, n)[: max(n, 0)]


@dataclass(frozen=True, kw_only=True)
class FeatureRequest:
    """Examples whose features a page last extracted (a small, picklable record).

    Attributes:
        detector: The detector whose features were extracted (``interpdetect``, ``spad``).
        source: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        dataset_key: Identifies the dataset (cache key).
        dataset_label: How the dataset is named on the page.
        split: The split the examples were drawn from (:data:`ALL_SPLITS`: any).
        limit: The number asked for.
        ids: The examples whose features were extracted, in order.
        n_failed: Examples that could not be analysed.
        errors: Why (the first few).
        computed: Examples that needed a traced pass.
        cache_hits: Examples read from the feature cache.
        seconds: Extraction wall time.
        model: :attr:`~core.model.LoadedModel.instance_key` of the model they were extracted with.
    """

    detector: str
    source: str
    dataset_key: str
    dataset_label: str
    split: str
    limit: int
    ids: tuple[str, ...]
    n_failed: int = 0
    errors: tuple[str, ...] = ()
    computed: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    model: str = ""


HeadStatsRequest = FeatureRequest
"""The Heads & layers page's request (InterpDetect features)."""


def extract_request(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detector: str,
    *,
    source: str,
    dataset_key: str,
    dataset_label: str,
    split: str,
    limit: int,
    progress: Callable[[int, int], None] | None = None,
) -> FeatureRequest:
    """``detector``'s features of ``examples`` (traced once each, then read from the
    shared feature cache), with progress; examples that fail are skipped and counted.

    Raises:
        StorageError: The feature cache cannot be opened.
        ModelError: The model cannot run the detector (e.g. spaCy model missing).
    """

    ext = extract_features(
        model,
        examples,
        [make_detector(detector)],
        cache=FeatureCache(get_store()),
        progress=progress,
        on_error="skip",
    )
    return FeatureRequest(
        detector=detector,
        source=source,
        dataset_key=dataset_key,
        dataset_label=dataset_label,
        split=split,
        limit=limit,
        ids=tuple(e.id for e in ext.examples),
        n_failed=len(ext.errors),
        errors=tuple(str(e) for e in ext.errors[:3]),
        computed=ext.computed,
        cache_hits=ext.cache_hits,
        seconds=ext.seconds,
        model=model.instance_key,
    )


def request_examples(
    request: FeatureRequest, examples: Sequence[RAGExample]
) -> tuple[RAGExample, ...]:
    """The examples ``request.ids`` names, in order, from the dataset's ``examples``.

    Raises:
        DataError: Some are no longer in the dataset.
    """
    by_id = {e.id: e for e in examples}
    missing = [i for i in request.ids if i not in by_id]
    if missing:
        raise DataError(
            f"{len(missing)} of the examples read before are no longer in "
            f"{request.dataset_label} (first: {missing[0]!r}); press the button again"
        )
    return tuple(by_id[i] for i in request.ids)


@st.cache_data(show_spinner="Summarising the features…", max_entries=32)
def _head_stats_cached(
    _model: LoadedModel,
    model_id: str,
    dataset_key: str,
    ids: tuple[str, ...],
    level: str,
    _examples: tuple[RAGExample, ...],
) -> HeadStats:
    """HeadStats of the examples ``ids``; keyed by model, dataset, ids and level.

    The features come from the feature cache, where :func:`extract_request` put
    them (traced again only if the cache lost them).
    """

    ext = extract_features(
        _model,
        _examples,
        [make_detector("interpdetect")],
        cache=FeatureCache(get_store()),
        on_error="skip",
    )
    return HeadStats.from_features(
        ext.features["interpdetect"],
        ext.examples,
        level=level,  # type: ignore[arg-type]
    )


def head_stats(
    model: LoadedModel, request: FeatureRequest, examples: Sequence[RAGExample], level: str
) -> HeadStats:
    """The statistics of ``request``'s examples at ``level`` (cached).

    Args:
        model: The loaded model.
        request: What :func:`extract_request` extracted.
        examples: The dataset's examples (those named by ``request.ids`` are used).
        level: ``response`` or ``chunk``.

    Raises:
        DataError: The examples are gone from the dataset, or none could be analysed.
        ModelError: The features come from several models.
    """
    chosen = request_examples(request, examples)
    return _head_stats_cached(
        model, model.instance_key, request.dataset_key, request.ids, level, chosen
    )


def redeep_detectors(shipped: ShippedDetectors) -> tuple[ShippedDetector, ...]:
    """The shipped ReDeEP detectors (``redeep_token``, ``redeep_chunk``) for the model."""
    return tuple(s for s in shipped.detectors if s.name in REDEEP_DETECTORS)


@st.cache_data(show_spinner=False, max_entries=16)
def _head_view_cached(
    _model: LoadedModel,
    model_id: str,
    _example: RAGExample,
    signature: str,
    response_ids: tuple[int, ...] | None,
    _detectors: tuple[Detector, ...],
    detectors_id: str,
) -> HeadView:
    """One traced pass -> every head's view of the answer; keyed by model, input, detectors."""

    return head_view(_model, _example, response_ids=response_ids, detectors=_detectors)


def answer_heads(
    model: LoadedModel,
    example: RAGExample,
    shipped: ShippedDetectors,
    *,
    response_ids: Sequence[int] | None = None,
) -> HeadView:
    """Every head's view of ``example``'s answer, judged by the shipped ReDeEP detectors
    (cached per model, input and detector set).

    Raises:
        DataError: The example cannot be laid out.
        ModelError: The trace or a detector failed.
    """
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    dets = redeep_detectors(shipped)
    detectors_id = f"{shipped.cache_id}|{','.join(d.name for d in dets)}"
    return _head_view_cached(
        model,
        model.instance_key,
        example,
        input_signature(example, ids),
        ids,
        tuple(d.detector for d in dets),
        detectors_id,
    )


# --------------------------------------------------------------------------- SPAD

SPAD = "spad"
QUICK_FIT_MIN = 16
"""A quick spad fit reads at least this many labelled examples."""
QUICK_FIT_OPTIONS: dict[str, Any] = {"n_iter": 0, "holdout": 0.0}
"""The quick fit: no search and no early-stopping hold-out (too few examples for either),
fixed shallow trees (:data:`core.detectors.spad.NO_SEARCH_PARAMS`); fits in a second."""


def shown_folder(folder: Path) -> str:
    """``folder`` relative to the checkout when inside it (as commands there name it)."""

    try:
        return str(folder.resolve().relative_to(repo_root()))
    except ValueError:
        return str(folder)


def train_command(detector: str, folder: Path) -> str:
    """The ``ragscope train`` command that makes ``detector``'s artifact for the loaded model
    (named as ``RAGSCOPE_MODEL`` names it, so the command loads the same one)."""
    return (
        f"ragscope train --model {model_spec()} --dataset builtin --detectors {detector} "
        f"--out {shown_folder(folder)}"
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class QuickSpad:
    """A spad detector fitted in this session on a few examples, to show the SPAD pages
    before a real one is trained (few examples, a short search: not one to trust).

    Attributes:
        detector: The fitted detector.
        model: :attr:`~core.model.LoadedModel.instance_key` of the model its features came from.
        dataset_label: The dataset it was fitted on.
        split: The split its examples came from (:data:`ALL_SPLITS`: any).
        ids: The training examples.
        n_hallucinated: Hallucinated training examples.
        n_faithful: Faithful training examples.
        seconds: Extraction and fit wall time.
        fit_id: Identifies the fit (cache keys).
    """

    detector: Detector
    model: str
    dataset_label: str
    split: str
    ids: tuple[str, ...]
    n_hallucinated: int
    n_faithful: int
    seconds: float
    fit_id: str


def quick_fit_examples(
    examples: Sequence[RAGExample], chosen: Sequence[RAGExample], limit: int
) -> tuple[str, list[RAGExample]]:
    """``(split, examples)`` a quick spad fit trains on: labelled examples of the train split
    (at least :data:`QUICK_FIT_MIN`, whole sources together) when the dataset has one, else
    the labelled examples of ``chosen`` (then the SHAP values are in-sample)."""
    if any(e.provenance.split == "train" for e in examples):
        return "train", stats_examples(examples, "train", max(limit, QUICK_FIT_MIN))
    return ALL_SPLITS, [e for e in chosen if e.label is not None]


def fit_quick_spad(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    *,
    dataset_label: str,
    split: str,
    progress: Callable[[int, int], None] | None = None,
) -> QuickSpad:
    """Extract spad features of ``examples`` (feature cache) and fit a quick detector.

    Raises:
        DataError: Fewer than two examples of each class could be analysed.
        StorageError: The feature cache cannot be opened.
        ModelError: The model cannot run the detector.
    """
    import time

    t0 = time.perf_counter()
    ext = extract_features(
        model,
        examples,
        [make_detector(SPAD)],
        cache=FeatureCache(get_store()),
        progress=progress,
        on_error="skip",
    )
    kept = [
        (f, e) for f, e in zip(ext.features[SPAD], ext.examples, strict=True) if e.label is not None
    ]
    n_hal = sum(1 for _, e in kept if e.label)
    n_fai = len(kept) - n_hal
    if min(n_hal, n_fai) < 2:
        raise DataError(
            f"a quick spad fit needs at least two hallucinated and two faithful answers; "
            f"{dataset_label} gave {n_hal} and {n_fai}. Pick a labelled dataset (the built-in "
            "labelled corpus has both) or read more examples"
        )
    det = make_detector(SPAD, **QUICK_FIT_OPTIONS)
    det.fit([f for f, _ in kept], [e for _, e in kept])
    ids = tuple(e.id for _, e in kept)
    fit_id = hashlib.sha256(
        json.dumps([model.instance_key, dataset_label, split, ids]).encode("utf-8")
    ).hexdigest()[:16]
    return QuickSpad(
        detector=det,
        model=model.instance_key,
        dataset_label=dataset_label,
        split=split,
        ids=ids,
        n_hallucinated=n_hal,
        n_faithful=n_fai,
        seconds=time.perf_counter() - t0,
        fit_id=fit_id,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class SpadChoice:
    """The spad detector the SPAD pages explain.

    Attributes:
        detector: The fitted detector.
        quick: Whether it is this session's quick fit (else the shipped artifact).
        shipped: The shipped detector's facts (``None`` for a quick fit).
        fit: The quick fit's facts (``None`` for the shipped detector).
        cache_id: Identifies it (cache keys).
    """

    detector: Detector
    quick: bool
    shipped: ShippedDetector | None
    fit: QuickSpad | None
    cache_id: str


def spad_choice(
    model: LoadedModel, shipped: ShippedDetectors, quick: QuickSpad | None
) -> SpadChoice | None:
    """The shipped spad for ``model`` when there is one, else this session's quick fit
    (when made with ``model``), else ``None``."""
    for d in shipped.detectors:
        if d.name == SPAD:
            return SpadChoice(
                detector=d.detector,
                quick=False,
                shipped=d,
                fit=None,
                cache_id=f"shipped|{shipped.cache_id}",
            )
    if quick is not None and quick.model == model.instance_key:
        return SpadChoice(
            detector=quick.detector,
            quick=True,
            shipped=None,
            fit=quick,
            cache_id=f"quick|{quick.fit_id}",
        )
    return None


@st.cache_data(show_spinner="Computing SHAP values…", max_entries=16)
def _shap_cached(
    _model: LoadedModel,
    model_id: str,
    dataset_key: str,
    ids: tuple[str, ...],
    _examples: tuple[RAGExample, ...],
    _detector: Detector,
    detector_id: str,
) -> ShapResult:
    """TreeSHAP of ``_detector`` on the examples ``ids``; keyed by model, dataset, ids and
    detector. Features come from the feature cache (traced again only if it lost them)."""

    ext = extract_features(
        _model, _examples, [make_detector(SPAD)], cache=FeatureCache(get_store()), on_error="skip"
    )
    if not ext.examples:
        raise DataError("none of the examples could be analysed")
    return shap_values(_detector, ext.features[SPAD])  # type: ignore[arg-type]


def shap_summary(
    model: LoadedModel,
    request: FeatureRequest,
    examples: Sequence[RAGExample],
    choice: SpadChoice,
) -> ShapResult:
    """SHAP values of ``choice``'s detector on ``request``'s examples (cached).

    Raises:
        DataError: The examples are gone from the dataset, or none could be analysed.
        ModelError: The detector was trained on another model.
    """
    chosen = request_examples(request, examples)
    return _shap_cached(
        model,
        model.instance_key,
        request.dataset_key,
        request.ids,
        chosen,
        choice.detector,
        choice.cache_id,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerSources:
    """One answer's seven-source split, from one traced pass.

    Attributes:
        example: The example as analysed.
        layout: The token layout the model read.
        sources: Every answer token's seven sources (:class:`core.spad.TokenSources`).
        pos: The POS tag of each answer token.
        features: The answer's spad features (the 126 POS x source means).
        seconds: Trace and split wall time.
    """

    example: RAGExample
    layout: Layout
    sources: TokenSources
    pos: tuple[str, ...]
    features: Features
    seconds: float

    @property
    def labels(self) -> np.ndarray | None:
        """Gold label per answer token (1 = inside a hallucinated span), when spans exist."""
        return self.layout.token_labels()


@st.cache_data(show_spinner=False, max_entries=16)
def _answer_sources_cached(
    _model: LoadedModel,
    model_id: str,
    _example: RAGExample,
    signature: str,
    response_ids: tuple[int, ...] | None,
) -> AnswerSources:
    """render -> one trace -> seven sources + POS + spad features; keyed by model and input."""
    import time

    t0 = time.perf_counter()
    det = make_detector(SPAD)
    layout = render(_example, _model, response_ids=response_ids)
    tr = trace(_model, layout, det.needs(_model.info))
    run = Run(
        example=_example, layout=layout, trace=tr, bare=None, model=_model.info, loaded=_model
    )
    sources = det.sources(run)  # shared within the run: features() reuses it
    features = det.features(run)
    return AnswerSources(
        example=_example,
        layout=layout,
        sources=sources,
        pos=response_pos(layout),
        features=features,
        seconds=time.perf_counter() - t0,
    )


def answer_sources(
    model: LoadedModel, example: RAGExample, *, response_ids: Sequence[int] | None = None
) -> AnswerSources:
    """The seven-source split of ``example``'s answer (cached per model and input).

    Raises:
        DataError: The example cannot be laid out.
        ModelError: The trace failed or spaCy's model is missing.
    """
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    return _answer_sources_cached(
        model, model.instance_key, example, input_signature(example, ids), ids
    )


@st.cache_data(show_spinner=False, max_entries=32)
def _answer_shap_cached(
    example_id: str, signature: str, _features: Features, _detector: Detector, detector_id: str
) -> ShapResult:

    return shap_values(_detector, [_features])  # type: ignore[arg-type]


def answer_shap(answer: AnswerSources, choice: SpadChoice) -> ShapResult:
    """SHAP values of ``choice``'s detector on one answer (cached per input and detector).

    Raises:
        ModelError: The detector was trained on another model.
    """
    sig = input_signature(answer.example, tuple(int(i) for i in answer.layout.response_ids))
    return _answer_shap_cached(
        answer.example.id,
        f"{answer.features.model}|{sig}",
        answer.features,
        choice.detector,
        choice.cache_id,
    )


# --------------------------------------------------------------------------- SAE features

RAGLENS = "raglens"


@dataclass(frozen=True, kw_only=True)
class ExplainRequest:
    """The answers whose SAE activations the Feature explanations page last read.

    Attributes:
        model: ``ModelInfo.key`` of the model they were read with.
        sae_key: :attr:`~core.sae.LoadedSAE.key` of the SAE.
        activation: ``post`` or ``pre``.
        source: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        dataset_key: Identifies the dataset (cache key).
        dataset_label: How the dataset is named on the page.
        split: The split the examples were drawn from (:data:`ALL_SPLITS`: any).
        limit: The number asked for.
        ids: The examples read, in order.
        errors: Why examples were left out (the first few).
        n_failed: Examples that could not be read.
        computed: Examples that needed a forward pass.
        seconds: Wall time.
    """

    model: str
    sae_key: str
    activation: str
    source: str
    dataset_key: str
    dataset_label: str
    split: str
    limit: int
    ids: tuple[str, ...]
    errors: tuple[str, ...] = ()
    n_failed: int = 0
    computed: int = 0
    seconds: float = 0.0


@st.cache_data(show_spinner="Reading SAE activations…", max_entries=256)
def _feature_examples_cached(
    _model: LoadedModel,
    model_id: str,
    _sae: LoadedSAE,
    sae_key: str,
    activation: str,
    dataset_key: str,
    ids: tuple[str, ...],
    _examples: tuple[RAGExample, ...],
    feature: int,
) -> FeatureExamples:
    """One feature's examples among the answers ``ids``; keyed by model, SAE and answers.

    The encoded answers come from :mod:`core.explain`'s in-process cache (read again only
    if it dropped them)."""

    return feature_examples(_model, _sae, _examples, feature, activation=activation)  # type: ignore[arg-type]


def sae_feature_examples(
    model: LoadedModel,
    sae: LoadedSAE,
    request: ExplainRequest,
    examples: Sequence[RAGExample],
    feature: int,
) -> FeatureExamples:
    """The examples of SAE feature ``feature`` among ``request``'s answers (cached).

    Raises:
        DataError: The request's examples are gone from the dataset.
        ModelError: The SAE was trained on another model.
    """
    by_id = {e.id: e for e in examples}
    missing = [i for i in request.ids if i not in by_id]
    if missing:
        raise DataError(
            f"{len(missing)} of the examples read are no longer in {request.dataset_label} "
            f"(e.g. {missing[0]!r}); press **Read activations** again"
        )
    return _feature_examples_cached(
        model,
        model.instance_key,
        sae,
        sae.key,
        request.activation,
        request.dataset_key,
        request.ids,
        tuple(by_id[i] for i in request.ids),
        int(feature),
    )


# --------------------------------------------------------------------------- session


@dataclass(frozen=True, kw_only=True)
class GeneratedAnswer:
    """An answer the model wrote in this session.

    Attributes:
        for_input: :func:`question_signature` of the question and passages it answers.
        text: The answer.
        token_ids: The model's own tokens (analysed exactly, no re-tokenizing).
        stop: Why generation stopped (``eos`` or ``max_tokens``).
        seconds: Generation wall time.
    """

    for_input: str
    text: str
    token_ids: tuple[int, ...]
    stop: str
    seconds: float


def question_signature(
    task: str, question: str | None, passages: Sequence[str], prompt: str | None = None
) -> str:
    """A content hash of what a generated answer answers."""
    payload = json.dumps([task, question, list(passages), prompt], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


@dataclass(kw_only=True)
class ExampleSelection:
    """Which examples a page reads: a dataset, one of its splits and at most how many.

    Attributes:
        source: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        split: The split (``None``: the page's default split when the dataset has
            it, else :data:`ALL_SPLITS`).
        limit: How many examples to read at most.
    """

    source: str = HEADS_FROM_HOME
    split: str | None = None
    limit: int = 16


@dataclass
class AppState:
    """Everything one session remembers across reruns and pages.

    Widget values live in ``st.session_state`` only while their page is shown; the
    values that must survive a page switch are copied here.

    Attributes:
        dataset: The dataset picked on Home (the Playground's example source).
        input_mode: :data:`INPUT_DATASET` or :data:`INPUT_OWN`.
        example_id: The picked example, per dataset key.
        answer_source: :data:`ANSWER_GENERATE` or :data:`ANSWER_PASTE`.
        pasted: The answer text in the paste box.
        prefilled_for: The example whose response was last put in the paste box.
        own_task: Task of the user's own example.
        own_question: Question of the user's own example.
        own_passages: Passage texts of the user's own example, by passage id.
        next_passage_id: Id for the next added passage (ids are never reused, so
            widget keys stay stable when one is removed).
        max_tokens: Generation length limit.
        temperature: Generation temperature (0 = greedy).
        generation: The last answer the model wrote.
        analysis: The last analysis.
        color_by: What the answer's tokens are coloured by: :data:`COLOR_SURPRISAL`
            or a shipped detector's name.
        imported_message: A note to show once after a successful import.
        import_error: Why the last import failed, shown until the next attempt.
        upload: The Home page's current upload, read once: its file id and report.
        bench_runs: The runs picked on the Benchmark (names; several = compare).
        bench_confusion: The Benchmark's confusion-matrix pick (``run/detector``).
        bench_breakdown_metric: What the Benchmark's breakdown bars show.
        bench_train: Dataset spec a new run trains on.
        bench_test: Dataset spec a new run tests on (:data:`SAME_DATASET`: the
            train dataset's own test split).
        bench_detectors: Detectors of a new run (``None``: every registered one).
        bench_limit: About how many examples a new run uses per dataset (0 = all).
        heads_top: How many top copying heads the Heads & layers page marks
            (``None``: ReDeEP's default).
        heads_selection: The examples the statistics read (default split: train).
        heads_unit: ``response`` (answers) or ``chunk`` (answer sentences).
        heads_request: The examples whose statistics were last computed.
        heads_example_source: The one-answer view's input: :data:`HEADS_EXAMPLE_DATASET`
            or :data:`HEADS_EXAMPLE_PLAYGROUND` (``None``: the Playground's analysed
            answer when there is one).
        heads_example_id: The one-answer view's example, per dataset key.
        heads_head: The head the one-answer view shows (``None``: the top copying head).
        shap_selection: The examples the SHAP summary explains (default split: test).
        shap_request: The examples whose spad features were last extracted.
        shap_top: How many features the beeswarm and the bar chart show.
        shap_grid: The grid's cells: ``mean`` (signed) or ``mean_abs`` SHAP.
        spad_quick: This session's quick spad fit (``None``: none made).
        tokens_example_source: The Token sources input: :data:`HEADS_EXAMPLE_DATASET` or
            :data:`HEADS_EXAMPLE_PLAYGROUND` (``None``: the Playground's analysed answer
            when there is one).
        tokens_dataset: Its dataset: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        tokens_example_id: The Token sources example, per dataset key.
        gam_feature: The SAE feature shown in close-up on the GAM shape functions page.
        gam_example_id: The answer explained on the GAM shape functions page.
        tokens_by_pos: Whether the token bars are aggregated by part of speech.
        explain_selection: The answers the Feature explanations page reads (default: the
            built-in labelled corpus, every split).
        explain_request: The answers whose SAE activations were last read.
        explain_features: The features picked from the raglens detector's (``None``:
            its most important ones).
        explain_ids: The feature ids typed in when there is no raglens detector
            (empty: the features that fire on the most answers).
        explain_top_n: How many of the picked features "Explain top N" explains.
        explain_stop: Set by the Stop button; the running batch checks it.
        explain_outcome: What the last explanation batch did, shown once.
        explain_fidelity: Fidelity results by explanation prompt hash.
        heatmap_example_source: The Token heatmaps input (like ``tokens_example_source``).
        heatmap_dataset: Its dataset: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        heatmap_example_id: The Token heatmaps example, per dataset key.
        heatmap_p_stay: The smoothing slider's ``p_stay``.
        heatmap_threshold: The flagging threshold (``None``: the CORTEX artifact's).
        heatmap_flag_row: The row whose scores the threshold reads (``None``: CORTEX smoothed).
        heatmap_smooth_all: Whether the other detectors' rows are smoothed too.
        heatmap_hidden: The rows the user took off the heatmap.
        heatmap_focus: Index of the predicted span "Previous"/"Next" jumped to (-1: none).
        heatmap_focus_for: The answer (signature) that focus belongs to.
        heatmap_only_flagged: Whether the example list keeps only answers with flags.
        heatmap_scan_limit: How many answers of the dataset a scan reads.
        heatmap_scan: Dataset key -> example id -> CORTEX raw token scores, from scans.
        cf_example_source: The Counterfactual page's input (like ``tokens_example_source``).
        cf_dataset: Its dataset: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        cf_example_id: The example it edits, per dataset key.
        cf_answer_mode: ``fixed`` (teacher-forced) or ``regenerate``.
        cf_result: The last comparison (or the loaded session).
        mit_example_source: The Mitigation page's input (like ``tokens_example_source``).
        mit_dataset: Its dataset: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        mit_example_id: The example it regenerates, per dataset key.
        mit_method: ``feedback``, ``aarf`` or ``steer``.
        mit_guide: The detector whose flags the feedback quotes (or instance level).
        mit_result: ``(method, example id, result, scores)`` of the last run.
    """

    dataset: DatasetRef = BUILTIN
    input_mode: str = INPUT_DATASET
    example_id: dict[str, str] = field(default_factory=dict)
    answer_source: str = ANSWER_PASTE
    pasted: str = ""
    prefilled_for: str | None = None
    own_task: str = "qa"
    own_question: str = ""
    own_passages: dict[int, str] = field(default_factory=lambda: {0: ""})
    next_passage_id: int = 1
    max_tokens: int = 96
    temperature: float = 0.0
    generation: GeneratedAnswer | None = None
    analysis: Analysis | None = None
    color_by: str = COLOR_SURPRISAL
    imported_message: str | None = None
    import_error: str | None = None
    upload: tuple[str, UploadReport] | None = None
    bench_runs: list[str] | None = None
    bench_confusion: str | None = None
    bench_breakdown_metric: str = "AUROC"
    bench_train: str = "demo"
    bench_test: str = SAME_DATASET
    bench_detectors: list[str] | None = None
    bench_limit: int = 200
    heads_top: int | None = None
    heads_selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=24))
    heads_unit: str = "response"
    heads_request: FeatureRequest | None = None
    heads_example_source: str | None = None
    heads_example_id: dict[str, str] = field(default_factory=dict)
    heads_head: tuple[int, int] | None = None
    shap_selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=16))
    shap_request: FeatureRequest | None = None
    shap_top: int = 15
    shap_grid: str = "mean"
    spad_quick: QuickSpad | None = None
    tokens_example_source: str | None = None
    tokens_dataset: str = HEADS_FROM_HOME
    tokens_example_id: dict[str, str] = field(default_factory=dict)
    gam_feature: int | None = None
    gam_example_id: str | None = None
    tokens_by_pos: bool = False
    explain_selection: ExampleSelection = field(
        default_factory=lambda: ExampleSelection(source=HEADS_FROM_CORPUS, limit=48)
    )
    explain_request: ExplainRequest | None = None
    explain_features: list[int] | None = None
    explain_ids: str = ""
    explain_top_n: int = 5
    explain_stop: bool = False
    explain_outcome: tuple[str, str] | None = None
    explain_fidelity: dict[str, FidelityResult] = field(default_factory=dict)
    heatmap_example_source: str | None = None
    heatmap_dataset: str = HEADS_FROM_HOME
    heatmap_example_id: dict[str, str] = field(default_factory=dict)
    heatmap_p_stay: float = P_STAY_TOKEN
    heatmap_threshold: float | None = None
    heatmap_flag_row: str | None = None
    heatmap_smooth_all: bool = False
    heatmap_hidden: set[str] = field(default_factory=set)
    heatmap_focus: int = -1
    heatmap_focus_for: str | None = None
    heatmap_only_flagged: bool = False
    heatmap_scan_limit: int = 40
    heatmap_scan: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    cf_example_source: str | None = None
    cf_dataset: str = HEADS_FROM_HOME
    cf_example_id: dict[str, str] = field(default_factory=dict)
    cf_answer_mode: str = "fixed"
    cf_result: Counterfactual | None = None
    mit_example_source: str | None = None
    mit_dataset: str = HEADS_FROM_HOME
    mit_example_id: dict[str, str] = field(default_factory=dict)
    mit_method: str = "feedback"
    mit_guide: str | None = None
    mit_result: tuple[Any, ...] | None = None

    def add_passage(self) -> None:
        self.own_passages[self.next_passage_id] = ""
        self.next_passage_id += 1

    def remove_passage(self, pid: int) -> None:
        if len(self.own_passages) > 1:
            self.own_passages.pop(pid, None)
            st.session_state.pop(passage_key(pid), None)


def app_state() -> AppState:
    """This session's :class:`AppState` (created on first use)."""
    state = st.session_state.get(STATE_KEY)
    if not isinstance(state, AppState):
        state = AppState()
        st.session_state[STATE_KEY] = state
    return state


def seed_widget(key: str, value: object) -> None:
    """Give a widget its remembered value when it is (re)created on a page.

    Call before creating the widget, without passing ``value=``/``index=`` to it.
    """
    if key not in st.session_state:
        st.session_state[key] = value
