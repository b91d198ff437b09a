"""SPAD: the shipped or quickly fitted detector, SHAP summaries, token sources; SHAP and Token sources widget keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import streamlit as st

from core.analysis.shap_values import shap_values
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.base.paths import repo_root
from core.data import BUILTIN
from core.detectors import DETECTORS, make_detector
from core.detectors.spad import SpadDetector
from core.engine.layout import render
from core.engine.trace import trace
from core.evaluation.quickfit import QuickFit, quick_fit
from core.evaluation.recipe import TrainRecipe
from core.learning.contract import Run
from core.pipeline.extract import FeatureCache, extract_features
from core.signals.attribution import response_pos

if TYPE_CHECKING:
    from core.analysis.shap_values import ShapResult
    from core.base.examples import RAGExample
    from core.engine.layout import Layout
    from core.engine.model import LoadedModel
    from core.learning.contract import Detector, Features
    from core.signals.attribution import TokenSources
from app.state.analysis import input_signature
from app.state.datasets import get_store
from app.state.detectors import ArtifactCard, DetectorSet
from app.state.heads import (
    ALL_SPLITS,
    AnswerChoice,
    ExampleSelection,
    FeatureRequest,
    request_examples,
    stats_examples,
)
from app.state.model import model_spec

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


SPAD = DETECTORS.explained("probability-sources")


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
    recipe = TrainRecipe(model=model_spec(), dataset=BUILTIN, detectors=(detector,))
    return recipe.command(out=shown_folder(folder))


QuickSpad = QuickFit
"""The session's quick spad fit (:class:`core.evaluation.quickfit.QuickFit`)."""


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
) -> QuickFit:
    """A spad detector fitted on ``examples`` with :data:`QUICK_FIT_OPTIONS`, features
    through the app's feature cache (:func:`core.evaluation.quickfit.quick_fit`)."""
    return quick_fit(
        model,
        examples,
        SPAD,
        options=QUICK_FIT_OPTIONS,
        cache=FeatureCache(get_store()),
        dataset_label=dataset_label,
        split=split,
        progress=progress,
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
    shipped: ArtifactCard | None
    fit: QuickSpad | None
    cache_id: str


def spad_choice(
    model: LoadedModel, shipped: DetectorSet, quick: QuickSpad | None
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
        sources: Every answer token's seven sources (:class:`core.signals.attribution.TokenSources`).
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
    assert isinstance(det, SpadDetector)  # the registry's class for SPAD
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


@dataclass(kw_only=True)
class ShapState:
    """The SHAP summary page's choices.

    Attributes:
        selection: The examples the SHAP summary explains (default split: test).
        request: The examples whose spad features were last extracted.
        top: How many features the beeswarm and the bar chart show.
        grid: The grid's cells: ``mean`` (signed) or ``mean_abs`` SHAP.
    """

    selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=24))
    request: FeatureRequest | None = None
    top: int = 15
    grid: str = "mean"


@dataclass(kw_only=True)
class TokenSourcesState(AnswerChoice):
    """The Token sources page's choices (its answer as every one-answer page picks it).

    The answer it shows: :class:`~app.state.heads.AnswerChoice`.

    Attributes:
        by_pos: Whether the token bars are aggregated by part of speech.
    """

    by_pos: bool = False
