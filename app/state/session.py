"""Session state: one :class:`AppState` per session (:func:`app_state`), widget seeding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import streamlit as st

if TYPE_CHECKING:
    from core.base.examples import RAGExample
from app.state.analysis import Analysis
from app.state.counterfactual import CounterfactualState
from app.state.datasets import DatasetRef, UploadReport, home_default
from app.state.features import ExplainState, GamState
from app.state.heads import HeadsState
from app.state.heatmaps import HeatmapState
from app.state.mitigation import MitigationState
from app.state.playground import (
    ANSWER_PASTE,
    CALIBRATE_AUTO,
    COLOR_SURPRISAL,
    INPUT_DATASET,
    GeneratedAnswer,
    passage_key,
)
from app.state.runs import BenchmarkState
from app.state.spad_views import QuickSpad, ShapState, TokenSourcesState

STATE_KEY = "ragscope.state"


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
        spad_quick: This session's quick spad fit (``None``: none made).
        bench: The Benchmark page (:class:`~app.state.runs.BenchmarkState`).
        heads: Heads & layers (:class:`~app.state.heads.HeadsState`).
        shap: SHAP summary (:class:`~app.state.spad_views.ShapState`).
        tokens: Token sources (:class:`~app.state.spad_views.TokenSourcesState`).
        gam: GAM shape functions (:class:`~app.state.features.GamState`).
        explain: Feature explanations (:class:`~app.state.features.ExplainState`).
        heatmap: Token heatmaps (:class:`~app.state.heatmaps.HeatmapState`).
        cf: Counterfactual (:class:`~app.state.counterfactual.CounterfactualState`).
        mit: Mitigation (:class:`~app.state.mitigation.MitigationState`).
    """

    dataset: DatasetRef = field(default_factory=home_default)
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
    spad_quick: QuickSpad | None = None
    bench: BenchmarkState = field(default_factory=BenchmarkState)
    heads: HeadsState = field(default_factory=HeadsState)
    shap: ShapState = field(default_factory=ShapState)
    tokens: TokenSourcesState = field(default_factory=TokenSourcesState)
    gam: GamState = field(default_factory=GamState)
    explain: ExplainState = field(default_factory=ExplainState)
    heatmap: HeatmapState = field(default_factory=HeatmapState)
    cf: CounterfactualState = field(default_factory=CounterfactualState)
    mit: MitigationState = field(default_factory=MitigationState)

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
