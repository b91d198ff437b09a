"""Heads & layers: example pools, feature requests, head statistics, one answer's heads; widget keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import streamlit as st

from core.analysis.heads_layers import HeadStats, head_view
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.data import (
    load_builtin,
    stratified_head,
)
from core.detectors import DETECTORS, make_detector
from core.evaluation.attribution_check import SpanCheck
from core.pipeline.extract import FeatureCache, extract_features

if TYPE_CHECKING:
    from core.analysis.heads_layers import HeadStats, HeadView
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel
    from core.learning.contract import Detector
from app.state.analysis import input_signature
from app.state.datasets import DatasetRef, get_store, load_examples
from app.state.detectors import ArtifactCard, DetectorSet
from app.state.runs import CORPUS

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


# Heads & layers: context attribution
KEY_HEADS_SPAN = "heads.context.span"
"""Prefix of the advanced pick of any answer tokens (a range slider per answer)."""


KEY_HEADS_SPAN_FROM = "heads.context.from"
"""Prefix of the choice between the set's spans and any tokens (one per answer)."""


KEY_HEADS_FLAGGED = "heads.context.flagged"
"""Prefix of the picker of the spans the set flags (one per answer)."""


KEY_HEADS_GROUP = "heads.context.group"


KEY_HEADS_CHECK = "heads.context.check"


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


HEAD_TOKENS = DETECTORS.explained("head-tokens")
"""The detector whose per-token head scores the page draws (ReDeEP, token level)."""
HEAD_CHUNKS = DETECTORS.explained("head-chunks")
"""The detector whose per-chunk scores the page tables (ReDeEP, chunk level)."""
HEAD_STATS = DETECTORS.explained("head-stats")
"""The detector whose features give every head's statistics over answers (InterpDetect)."""
REDEEP_DETECTORS: tuple[str, ...] = (HEAD_TOKENS, HEAD_CHUNKS)
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
        model: :attr:`~core.engine.model.LoadedModel.instance_key` of the model they were extracted with.
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


@dataclass(kw_only=True)
class AnswerChoice:
    """Which answer a one-answer page shows (Token heatmaps, Token sources,
    Counterfactual, Mitigation, GAM shape functions): the Playground's analysed answer or
    an example of a dataset (:func:`app.components.answer_picker.pick_page_answer` keeps
    it).

    Attributes:
        example_source: :data:`HEADS_EXAMPLE_DATASET` or :data:`HEADS_EXAMPLE_PLAYGROUND`
            (``None``: the Playground's analysed answer when there is one).
        dataset: Its dataset: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`.
        example_id: The example shown, per dataset key.
    """

    example_source: str | None = None
    dataset: str = HEADS_FROM_HOME
    example_id: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class HeadsState:
    """The Heads & layers page's choices: the statistics' examples and the one-answer view.

    Attributes:
        top: How many top copying heads the Heads & layers page marks
            (``None``: ReDeEP's default).
        selection: The examples the statistics read (default split: train).
        unit: ``response`` (answers) or ``chunk`` (answer sentences).
        request: The examples whose statistics were last computed.
        example_source: The one-answer view's input: :data:`HEADS_EXAMPLE_DATASET`
            or :data:`HEADS_EXAMPLE_PLAYGROUND` (``None``: the Playground's analysed
            answer when there is one).
        example_id: The one-answer view's example, per dataset key.
        head: The head the one-answer view shows (``None``: the top copying head).
        span: The context attribution's answer tokens ``[a, b)`` (``None``: the first
            span the set flags, else the first answer sentence).
        span_answer: The answer ``span`` is of (:func:`app.components.context_view.answer_tag`):
            another answer opens on its own default.
        group: The context attribution's head group.
        checks: Ablation checks run this session, by answer, span and group.
    """

    top: int | None = None
    selection: ExampleSelection = field(default_factory=lambda: ExampleSelection(limit=24))
    unit: str = "response"
    request: FeatureRequest | None = None
    example_source: str | None = None
    example_id: dict[str, str] = field(default_factory=dict)
    head: tuple[int, int] | None = None
    span: tuple[int, int] | None = None
    span_answer: str = ""
    group: str = "all"
    checks: dict[tuple[str, int, int, str], SpanCheck | None] = field(default_factory=dict)


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
        [make_detector(HEAD_STATS)],
        cache=FeatureCache(get_store()),
        on_error="skip",
    )
    return HeadStats.from_features(
        ext.features[HEAD_STATS],
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


def redeep_detectors(shipped: DetectorSet) -> tuple[ArtifactCard, ...]:
    """The shipped detectors of :data:`REDEEP_DETECTORS` for the model."""
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
    shipped: DetectorSet,
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
