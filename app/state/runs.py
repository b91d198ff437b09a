"""Evaluation runs and dataset summaries for the Benchmark page, and its widget keys.

Saved runs come in three kinds (:func:`core.evaluation.runs.load_run` tells them apart by the
file's ``kind``): train / validation / test runs (:class:`~core.evaluation.evaluate.EvalRun`),
cross-validations (:class:`~core.evaluation.cv_run.CVRun`) and cross-domain matrices
(:class:`~core.evaluation.matrix.MatrixRun`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import streamlit as st

from app.state.datasets import dataset_choices
from core.base.errors import DataError
from core.base.paths import runs_dir, shipped_runs_dir
from core.data import (
    resolve_dataset,
)
from core.evaluation.cv_run import CVRun
from core.evaluation.evaluate import EvalRun, list_runs
from core.evaluation.matrix import MatrixRun
from core.evaluation.review_curve import CurveRun
from core.evaluation.runs import load_run

R = TypeVar("R", EvalRun, CVRun, MatrixRun, CurveRun)

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


# Benchmark: cross-validation runs
KEY_BENCH_CV_RUNS = "benchmark.cv.runs"


KEY_BENCH_CV_DATASET_METRIC = "benchmark.cv.dataset_metric"


KEY_BENCH_CV_RELIABILITY = "benchmark.cv.reliability_detectors"


# Benchmark: cross-domain matrices
KEY_BENCH_CURVE_RUNS = "benchmark.curves.runs"
"""The learning-curve runs shown (one per dataset by default)."""
KEY_BENCH_CURVE_METRIC = "benchmark.curves.metric"
"""What the learning curves show."""
KEY_BENCH_MATRIX_RUN = "benchmark.matrix.run"


KEY_BENCH_MATRIX_DETECTOR = "benchmark.matrix.detector"


KEY_BENCH_MATRIX_METRIC = "benchmark.matrix.metric"


SAME_DATASET = ""
"""The Benchmark's test-dataset choice meaning "the train dataset's own test split"."""


def threshold_key(run: str, detector: str) -> str:
    """Widget key of the Benchmark's threshold slider for ``detector`` in run ``run``.

    One key per run and detector, so each slider starts at that detector's validation
    threshold and remembers where it was moved to.
    """
    return f"benchmark.threshold.{run}.{detector}"


def download_key(what: str, run: str = "") -> str:
    """Widget key of a Benchmark download button: ``what`` it downloads (``cv.table``,
    ``cv.folds``, ``matrix``...), of run ``run`` when there is one per run."""
    return f"benchmark.download.{what}.{run}"


AnyRun = EvalRun | CVRun | MatrixRun


@st.cache_data(show_spinner=False, max_entries=64)
def _read_run(path: str, mtime: float) -> AnyRun:
    """One saved run of any kind; ``mtime`` keys the cache (a re-saved run is read again).

    Raises:
        DataError: Not a readable run, or one whose parts do not fit together
            (:func:`core.evaluation.runs.load_run` checks them).
    """
    return load_run(path)


@dataclass(frozen=True, kw_only=True, eq=False)
class SavedRuns:
    """The runs saved in the runs folder, then those shipped with ragscope.

    Each kind is ordered the same way: this machine's newest first, then the shipped
    ones by name; a local run shadows a shipped one of the same name (whatever its kind).

    Attributes:
        folder: Where this machine's runs are read from (and new runs saved).
        runs: Run name -> train / test evaluation run.
        cv: Run name -> cross-validation run.
        matrices: Run name -> cross-domain matrix run.
        curves: Run name -> review learning-curve run.
        shipped: Names of the runs (of any kind) that came from ``shipped_folder``.
        shipped_folder: Where the shipped runs live (``assets/runs``).
        unreadable: ``(file name, reason)`` per JSON file that is not a readable run.
    """

    folder: Path
    runs: dict[str, EvalRun]
    cv: dict[str, CVRun] = field(default_factory=dict)
    matrices: dict[str, MatrixRun] = field(default_factory=dict)
    curves: dict[str, CurveRun] = field(default_factory=dict)
    shipped: frozenset[str] = frozenset()
    shipped_folder: Path | None = None
    unreadable: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        """Whether no run of any kind was found."""
        return not (self.runs or self.cv or self.matrices or self.curves)


def newest_first(runs: Mapping[str, R], shipped: frozenset[str] | set[str]) -> dict[str, R]:
    """``runs`` with this machine's first, then the shipped ones (``shipped``), each part
    ordered by the time the run records it was made, newest first, ties by name (a
    file's date says nothing in a fresh clone, where every file has the same)."""
    by_name = sorted(runs.items())
    by_time = sorted(by_name, key=lambda kv: str(kv[1].created_at), reverse=True)
    return dict(sorted(by_time, key=lambda kv: kv[0] in shipped))


class Dated(Protocol):
    """A saved run of any kind, as far as its listing goes: when it was made."""

    @property
    def created_at(self) -> str: ...


def newest(runs: Mapping[str, Dated]) -> str | None:
    """The name of the run made last, by the time it records (not local before shipped:
    an old run of this machine does not hide a newer shipped one); a tie goes to the one
    listed first. ``None`` without runs."""
    return max(runs, key=lambda n: str(runs[n].created_at)) if runs else None


def newest_per(runs: Mapping[str, R], key: Callable[[R], str]) -> list[str]:
    """For each distinct ``key`` of the runs (a curve run's dataset), the newest run
    (:func:`newest`), in the order those runs are listed."""
    best: dict[str, str] = {}
    for n, run in runs.items():
        k = key(run)
        if k not in best or str(run.created_at) > str(runs[best[k]].created_at):
            best[k] = n
    chosen = set(best.values())
    return [n for n in runs if n in chosen]


def saved_runs() -> SavedRuns:
    """This machine's runs (:func:`core.evaluation.evaluate.runs_dir`) and the shipped ones, by kind."""

    folder, shipped_folder = runs_dir(), shipped_runs_dir()
    evals: dict[str, EvalRun] = {}
    cvs: dict[str, CVRun] = {}
    matrices: dict[str, MatrixRun] = {}
    curves: dict[str, CurveRun] = {}
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
        if any(run.name in kind for kind in (evals, cvs, matrices, curves)):
            continue  # shadowed by a newer or a local run of that name
        if isinstance(run, CVRun):
            cvs[run.name] = run
        elif isinstance(run, CurveRun):
            curves[run.name] = run
        elif isinstance(run, MatrixRun):
            matrices[run.name] = run
        else:
            evals[run.name] = run
        if path in ship_paths:
            shipped.add(run.name)
    return SavedRuns(
        folder=folder,
        runs=newest_first(evals, shipped),
        cv=newest_first(cvs, shipped),
        matrices=newest_first(matrices, shipped),
        curves=newest_first(curves, shipped),
        shipped=frozenset(shipped),
        shipped_folder=shipped_folder,
        unreadable=tuple(bad),
    )


CORPUS = "builtin"
"""Spec of the built-in labelled corpus (see :func:`core.data.resolve_dataset`)."""


def eval_dataset_choices() -> dict[str, str]:
    """Dataset spec -> label, for the Benchmark's new-run pickers.

    The demo examples and the built-in corpus, the shared dev sets (``shared:NAME``) and
    the imported datasets (``stored:NAME``: a stored name is never read as a path or an
    alias, :attr:`DatasetRef.spec`). Whether a spec can be read is up to
    :func:`dataset_summary`.

    Raises:
        StorageError: The database cannot be opened.
    """
    out = {
        "demo": "Demo examples (12, hand-written)",
        "demo-full": "Demo examples, full (72, hand-written and hand-checked)",
        CORPUS: "Built-in labelled corpus",
    }
    for ref in dataset_choices():
        if ref.kind in ("shared", "store"):
            out[ref.spec] = ref.label
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


@dataclass(kw_only=True)
class BenchmarkState:
    """The Benchmark page's choices: the runs shown and compared, and a new run's inputs.

    Attributes:
        runs: The runs picked on the Benchmark (names; several = compare).
        confusion: The Benchmark's confusion-matrix pick (``run/detector``).
        breakdown_metric: What the Benchmark's breakdown bars show.
        train: Dataset spec a new run trains on.
        test: Dataset spec a new run tests on (:data:`SAME_DATASET`: the
            train dataset's own test split).
        detectors: Detectors of a new run (``None``: every registered one).
        limit: About how many examples a new run uses per dataset (0 = all).
        cv_runs: The cross-validation runs picked on the Benchmark (names).
        cv_dataset_metric: What the per-dataset bars of a cross-validation show.
        cv_reliability: The ``run/detector`` pairs of the reliability diagram
            (``None``: every detector of the first picked run).
        matrix_run: The cross-domain matrix run shown.
        matrix_detector: Its detector shown.
        matrix_metric: The matrix's metric (``AUROC``, ``AP`` or ``balanced accuracy``).
    """

    runs: list[str] | None = None
    confusion: str | None = None
    breakdown_metric: str = "AUROC"
    train: str = "demo"
    test: str = SAME_DATASET
    detectors: list[str] | None = None
    limit: int = 200
    cv_runs: list[str] | None = None
    cv_dataset_metric: str = "AUROC"
    cv_reliability: list[str] | None = None
    matrix_run: str | None = None
    matrix_detector: str | None = None
    matrix_metric: str = "AUROC"
