"""Session state: one :class:`AppState` per session (:func:`app_state`), widget seeding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import streamlit as st

from core.signals.smoothing import P_STAY_TOKEN

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.explain import FidelityResult
    from core.interventions.counterfactual import Counterfactual
from app.state.analysis import Analysis
from app.state.datasets import BUILTIN, DatasetRef, UploadReport
from app.state.features import ExplainRequest
from app.state.heads import (
    HEADS_FROM_CORPUS,
    HEADS_FROM_HOME,
    FeatureRequest,
)
from app.state.playground import (
    ANSWER_PASTE,
    CALIBRATE_AUTO,
    COLOR_SURPRISAL,
    INPUT_DATASET,
    GeneratedAnswer,
    passage_key,
)
from app.state.runs import SAME_DATASET
from app.state.spad_views import QuickSpad

STATE_KEY = "ragscope.state"


KEY_HEATMAP_SOURCE = "heatmaps.example.source"


KEY_HEATMAP_DATASET = "heatmaps.dataset"


KEY_HEATMAP_EXAMPLE = "heatmaps.example.id"


KEY_CF_SOURCE = "cf.example.source"


KEY_CF_DATASET = "cf.dataset"


KEY_CF_EXAMPLE = "cf.example.id"


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
        linked_answer: The answer an opened link's ``input`` carried (a page's "Playground"
            answer until the Playground analyses another).
        color_by: What the answer's tokens are coloured by: :data:`COLOR_SURPRISAL`
            or a shipped detector's name.
        calibrate_as: Whose calibration judges the Playground's answer:
            :data:`CALIBRATE_AUTO`, :data:`CALIBRATE_POOLED` or a training dataset.
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
        bench_cv_runs: The cross-validation runs picked on the Benchmark (names).
        bench_cv_dataset_metric: What the per-dataset bars of a cross-validation show.
        bench_cv_reliability: The ``run/detector`` pairs of the reliability diagram
            (``None``: every detector of the first picked run).
        bench_matrix_run: The cross-domain matrix run shown.
        bench_matrix_detector: Its detector shown.
        bench_matrix_metric: The matrix's metric (``AUROC``, ``AP`` or ``balanced accuracy``).
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
        mit_result: ``(method, example id, result, scores[, the feedback turn sent])`` of the last run.
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
    linked_answer: RAGExample | None = None
    color_by: str = COLOR_SURPRISAL
    calibrate_as: str = CALIBRATE_AUTO
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
    bench_cv_runs: list[str] | None = None
    bench_cv_dataset_metric: str = "AUROC"
    bench_cv_reliability: list[str] | None = None
    bench_matrix_run: str | None = None
    bench_matrix_detector: str | None = None
    bench_matrix_metric: str = "AUROC"
    heads_top: int | None = None
    heads_selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=8))
    heads_unit: str = "response"
    heads_request: FeatureRequest | None = None
    heads_example_source: str | None = None
    heads_example_id: dict[str, str] = field(default_factory=dict)
    heads_head: tuple[int, int] | None = None
    shap_selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=8))
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
    heatmap_scan_limit: int = 16
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
