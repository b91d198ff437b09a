"""SAE feature examples for the Feature explanations page, and its widget keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import streamlit as st

from app.state.heads import AnswerChoice, ExampleSelection
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.detectors import DETECTORS
from core.explain import BatchResult, FidelityResult, feature_examples

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel
    from core.explain import FeatureExamples
    from core.signals.sae import LoadedSAE


# Feature explanations
KEY_EXPLAIN_SOURCE = "explain.source"


KEY_EXPLAIN_SPLIT = "explain.split"


KEY_EXPLAIN_LIMIT = "explain.limit"


KEY_EXPLAIN_READ = "explain.read"


KEY_EXPLAIN_FEATURES = "explain.features"


KEY_EXPLAIN_IDS = "explain.ids"


KEY_EXPLAIN_TOP_N = "explain.top_n"


KEY_EXPLAIN_RUN = "explain.run"


KEY_EXPLAIN_STOP = "explain.stop"


def explain_one_key(feature: int) -> str:
    """Widget key of the Feature explanations page's "Explain" button of one feature."""
    return f"explain.one.{feature}"


def fidelity_key(feature: int) -> str:
    """Widget key of the Feature explanations page's "Check fidelity" button of one feature."""
    return f"explain.fidelity.{feature}"


RAGLENS = DETECTORS.explained("sae-features")


@dataclass(frozen=True, kw_only=True)
class ExplainRequest:
    """The answers whose SAE activations the Feature explanations page last read.

    Attributes:
        model: ``ModelInfo.key`` of the model they were read with.
        sae_key: :attr:`~core.signals.sae.LoadedSAE.key` of the SAE.
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


@dataclass(kw_only=True)
class GamState:
    """The GAM shape functions page's choices.

    Attributes:
        feature: The SAE feature shown in close-up on the GAM shape functions page.
        answer: The answer explained there: the Playground's analysed answer or an
            example of a dataset (:func:`app.components.answer_picker.pick_page_answer`).
    """

    feature: int | None = None
    answer: AnswerChoice = field(default_factory=AnswerChoice)


@dataclass(kw_only=True)
class ExplainState:
    """The Feature explanations page's choices and its last results.

    Attributes:
        selection: The answers the Feature explanations page reads (default: the
            dataset picked on Home, every split).
        request: The answers whose SAE activations were last read.
        features: The features picked from the raglens detector's (``None``:
            its most important ones).
        ids: The feature ids typed in when there is no raglens detector
            (empty: the features that fire on the most answers).
        top_n: How many of the picked features "Explain top N" explains.
        stop: Set by the Stop button; the running batch checks it.
        outcome: What the last explanation batch did, shown once.
        fidelity: Fidelity results by explanation prompt hash.
    """

    selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=48))
    request: ExplainRequest | None = None
    features: list[int] | None = None
    ids: str = ""
    top_n: int = 5
    stop: bool = False
    outcome: tuple[str, str] | None = None
    fidelity: dict[str, FidelityResult] = field(default_factory=dict)


def request_stop(explain: ExplainState) -> None:
    """The Stop button's callback: the running "Explain top N" batch stops before its next
    feature."""
    explain.stop = True


def settle_stop(explain: ExplainState) -> None:
    """After a stopped batch (the rerun the Stop button starts): clear the request and
    leave the notice that it stopped."""
    if explain.stop:
        explain.stop = False
        explain.outcome = (
            "info",
            "Stopped. The explanations written before the stop are cached; press "
            "**Explain top N** again to go on.",
        )


def fit_top_n(explain: ExplainState, n_max: int) -> None:
    """Keep "Explain top N" within ``1..n_max`` (else 5, or ``n_max`` when fewer), the
    widget's own value dropped when it is reset."""
    if not 1 <= explain.top_n <= n_max:
        explain.top_n = min(5, n_max)
        st.session_state.pop(KEY_EXPLAIN_TOP_N, None)


def batch_outcome(result: BatchResult) -> tuple[str, str]:
    """What an "Explain top N" batch did, as ``(kind, text)`` for
    :attr:`ExplainState.outcome` (kind: ``error``, ``info`` or ``success``)."""
    parts = [f"{len(result.done)} of {result.total} features explained"]
    if result.done:
        parts.append(f"{result.n_requested} asked, {len(result.done) - result.n_requested} cached")
    if result.skipped:
        parts.append(f"{len(result.skipped)} fire on none of these answers")
    text = " · ".join(parts) + "."
    if result.error:
        return "error", f"{text} Stopped on an error: {result.error}"
    if result.cancelled:
        return "info", f"{text} Stopped on request."
    return "success", text


# The gam page's widgets
KEY_GAM_FEATURE = "gam.feature"
KEY_GAM_TOP = "gam.top"
KEY_GAM_EXAMPLE = "gam.example"
KEY_GAM_SOURCE = "gam.example.source"
KEY_GAM_DATASET = "gam.example.dataset"
