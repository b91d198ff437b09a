"""The one place for the app's cached resources, cached computations and session state.

- Resources (``st.cache_resource``): the model (shared by every session; its own lock
  guards forward passes) and the SQLite store.
- Pure computations (``st.cache_data``): dataset files read into examples, and the
  analysis of one example (render -> trace -> surprisal). None of them reads
  ``st.session_state``; everything they depend on is an argument.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import streamlit as st

from core.errors import DataError, ModelError

if TYPE_CHECKING:
    import pandas as pd

    from core.evaluate import EvalRun
    from core.examples import RAGExample
    from core.layout import Layout
    from core.model import LoadedModel
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

ANSWER_GENERATE = "Let the model write the answer"
ANSWER_PASTE = "Paste an answer"
ANSWER_SOURCES: tuple[str, ...] = (ANSWER_GENERATE, ANSWER_PASTE)


def passage_key(pid: int) -> str:
    """Widget key of the text area of own-example passage ``pid``."""
    return f"playground.own.passage.{pid}"


def remove_passage_key(pid: int) -> str:
    """Widget key of the remove button of own-example passage ``pid``."""
    return f"playground.own.remove.{pid}"


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
        from core.model import load_model

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
    from core.examples import RAGExample
    from core.layout import render
    from core.trace import response_needs, trace

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


def model_key(model: LoadedModel) -> str:
    """A string that identifies the model's weights, for cache keys."""
    i = model.info
    return f"{i.name}|{model.source}|{i.device}|{i.dtype}"


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
        if self.kind == "builtin":
            return f"Built-in demo examples{n}"
        if self.kind == "shared":
            return f"Shared dev set: {self.name}{n}"
        return f"Imported: {self.name}{n}"

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}:{self.path or ''}"


BUILTIN = DatasetRef(kind="builtin", name="demo")


@st.cache_data(show_spinner="Reading the built-in examples…")
def _builtin_examples() -> list[RAGExample]:
    from core.datasets import builtin_examples

    return builtin_examples()


@st.cache_data(show_spinner="Reading the dataset file…", max_entries=8)
def _file_examples(path: str, mtime: float) -> list[RAGExample]:
    """Examples of a dataset file (bad records skipped); ``mtime`` keys the cache."""
    from core.datasets import load_dataset

    return list(load_dataset(path, on_error="skip").examples)


@st.cache_data(show_spinner="Reading the imported dataset…", max_entries=8)
def _stored_examples(db_path: str, name: str, created_at: str) -> list[RAGExample]:
    """Examples of a stored dataset; ``created_at`` keys the cache (re-imports change it)."""
    return _store(db_path).load_examples(name)


@st.cache_resource(show_spinner=False)
def _store(db_path: str) -> Store:
    from core.storage import Store

    return Store(db_path)


def get_store() -> Store:
    """The shared database (``RAGSCOPE_DB``, else in the cache dir)."""
    from core.storage import default_db_path

    return _store(str(default_db_path()))


def dataset_choices() -> list[DatasetRef]:
    """Every dataset the app can offer: built-in, shared dev sets, imported ones.

    Raises:
        StorageError: The database cannot be opened.
    """
    from core.datasets import shared_data_dir

    out = [BUILTIN]
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
    if ref.kind == "builtin":
        return _builtin_examples()
    if ref.kind == "shared":
        assert ref.path is not None
        return _file_examples(ref.path, Path(ref.path).stat().st_mtime)
    store = get_store()
    info = {d.name: d for d in store.list_datasets()}.get(ref.name)
    if info is None:
        from core.errors import StorageError

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


@st.cache_data(show_spinner="Reading the uploaded file…", max_entries=4)
def read_upload(file_name: str, data: bytes) -> UploadReport:
    """Read an uploaded ``.jsonl``/``.csv`` with ``on_error="skip"``.

    The bytes go to a temporary file named like the upload (the loader detects the
    format from the name and content); record locations are reported as
    ``file_name:LINE``.

    Raises:
        DataError: The file as a whole is unreadable (empty, not UTF-8, unknown layout).
    """
    import tempfile
    from dataclasses import replace

    from core.datasets import load_dataset

    safe_name = Path(file_name).name or "upload.jsonl"
    with tempfile.TemporaryDirectory(prefix="ragscope-upload-") as tmp:
        path = Path(tmp) / safe_name
        path.write_bytes(data)
        prefix = str(path)
        try:
            report = load_dataset(path, on_error="skip", dataset=path.stem)
        except DataError as e:
            raise DataError(str(e).replace(prefix, safe_name)) from e

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
    from core.evaluate import EvalRun

    return EvalRun.load(path)


@dataclass(frozen=True, kw_only=True, eq=False)
class SavedRuns:
    """The runs saved in a runs folder.

    Attributes:
        folder: Where they were read from.
        runs: Run name -> run, newest first.
        unreadable: ``(file name, reason)`` per JSON file that is not a readable run.
    """

    folder: Path
    runs: dict[str, EvalRun]
    unreadable: tuple[tuple[str, str], ...]


def saved_runs() -> SavedRuns:
    """The runs in :func:`core.evaluate.runs_dir`, newest first (each file read once)."""
    from core.evaluate import list_runs, runs_dir

    folder = runs_dir()
    runs: dict[str, EvalRun] = {}
    bad: list[tuple[str, str]] = []
    for path in list_runs(folder):
        try:
            run = _read_run(str(path), path.stat().st_mtime)
        except (DataError, OSError) as e:
            bad.append((path.name, str(e)))
            continue
        runs.setdefault(run.name, run)
    return SavedRuns(folder=folder, runs=runs, unreadable=tuple(bad))


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
    from core.datasets import resolve_dataset

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
    from core.layout import render
    from core.trace import response_needs, token_surprisal, trace

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
    layout, surprisal, seconds = _analyse_cached(model, model_key(model), example, sig, ids)
    return Analysis(
        example=example,
        layout=layout,
        surprisal=surprisal,
        trace_seconds=seconds,
        answer_source=answer_source,
        model_name=model.info.display_name,
        signature=sig,
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
        imported_message: A note to show once after a successful import.
        import_error: Why the last import failed, shown until the next attempt.
        bench_runs: The runs picked on the Benchmark (names; several = compare).
        bench_confusion: The Benchmark's confusion-matrix pick (``run/detector``).
        bench_breakdown_metric: What the Benchmark's breakdown bars show.
        bench_train: Dataset spec a new run trains on.
        bench_test: Dataset spec a new run tests on (:data:`SAME_DATASET`: the
            train dataset's own test split).
        bench_detectors: Detectors of a new run (``None``: every registered one).
        bench_limit: About how many examples a new run uses per dataset (0 = all).
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
    imported_message: str | None = None
    import_error: str | None = None
    bench_runs: list[str] | None = None
    bench_confusion: str | None = None
    bench_breakdown_metric: str = "AUROC"
    bench_train: str = "demo"
    bench_test: str = SAME_DATASET
    bench_detectors: list[str] | None = None
    bench_limit: int = 200

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
