"""Review: the page's widget keys, its state (the span queue's and the whole-answer
queue's) and the datasets it reviews."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import streamlit as st

from app.state.datasets import DatasetRef, dataset_choices
from app.state.heads import review_key

STATE_KEY = "ragscope.review"
CORPUS_LABEL = "Built-in labelled corpus"
UNSET = "unset"

KEY_NAME = "review.name"
KEY_START = "review.start"
KEY_CHANGE = "review.change_name"
KEY_DATASET = "review.dataset"
KEY_DETECTORS = "review.detectors"
KEY_SPAN_SOURCE = "review.span_source"
SET_SPANS = "The set's spans"
"""The scan's default: the spans the set decides, as every page shows them."""
DETECTOR_SPANS = "Chosen detectors' own spans"
"""A researcher's scan: chosen detectors' spans at their own token thresholds."""
KEY_LIMIT = "review.limit"
KEY_SMOOTH = "review.smooth"
KEY_RESCAN = "review.rescan"
KEY_BUILD = "review.build"
KEY_F_DETECTORS = "review.f.detectors"
KEY_F_STATUS = "review.f.status"
KEY_F_TASK = "review.f.task"
KEY_F_GENERATOR = "review.f.generator"
KEY_SORT = "review.sort"
KEY_TABLE = "review.table"
KEY_ACCEPT = "review.accept"
KEY_REJECT = "review.reject"
KEY_NEXT = "review.next"
KEY_PREV = "review.prev"
KEY_EXPORT_WHO = "review.export.who"
KEY_EXPORT_ALL = "review.export.all"
KEY_EXPORT_NAME = "review.export.name"
KEY_EXPORT_SAVE = "review.export.save"
KEY_EXPORT_REPLACE = "review.export.replace"
KEY_REPORT = "review.report"
KEY_ADD_SPAN = "review.add_span"
KEY_REPORT_GET = "review.report.get"
KEY_MODE = "review.mode"
KEY_ORDER = "review.order"
KEY_FAITHFUL = "review.answer.faithful"
KEY_HALLUCINATED = "review.answer.hallucinated"
KEY_A_NEXT = "review.answer.next"
KEY_A_PREV = "review.answer.prev"
KEY_A_NOTE = "review.answer.note"
KEY_A_SKIP_MINE = "review.answer.skip_mine"
KEY_ADAPT_START = "review.adapt.start"
KEY_ADAPT_CANCEL = "review.adapt.cancel"
KEY_ADAPT_RESUME = "review.adapt.resume"
KEY_ADAPT_DISCARD = "review.adapt.discard"
KEY_ADAPT_REFIT = "review.adapt.refit"


@dataclass
class AnswerQueueState:
    """Where the reviewer is in the whole-answer queue."""

    current: str | None = None  # example id
    outcome: tuple[str, str] | None = None  # (kind, text), shown once
    order: str = "random"


@dataclass
class ReviewState:
    reviewer: str | None = None
    current: int | None = None  # item id
    outcome: tuple[str, str] | None = None  # (kind, text), shown once
    build_report: tuple[str, str] | None = None  # (kind, text) of the last scan
    thresholds: dict[str, float] = field(default_factory=dict)
    report: tuple[str, str] | None = None  # (example id, HTML)
    answers: AnswerQueueState = field(default_factory=AnswerQueueState)
    mode: str = "spans"
    dataset: str | None = None  # the dataset key picked here, when not Home's


def review_seed(options: Mapping[str, object], home: str, picked: str | None) -> str | None:
    """The dataset key Review's choice opens on: the one picked on this page earlier,
    else Home's dataset, else none (the first option, the built-in corpus)."""
    for key in (picked, home):
        if key is not None and key in options:
            return key
    return None


def page_state() -> ReviewState:
    if STATE_KEY not in st.session_state:
        st.session_state[STATE_KEY] = ReviewState()
    return st.session_state[STATE_KEY]


def item_key(control: str, item_id: int) -> str:
    """The widget key of one item's control (span, kind, evidence, note, missed)."""
    return f"review.{control}.{item_id}"


def threshold_key(name: str) -> str:
    return f"review.threshold.{name}"


def dataset_options() -> dict[str, tuple[str, DatasetRef | None]]:
    """Dataset key -> (label, reference); the built-in corpus has no reference."""
    out: dict[str, tuple[str, DatasetRef | None]] = {review_key(None): (CORPUS_LABEL, None)}
    for ref in dataset_choices():
        out[review_key(ref)] = (ref.label, ref)
    return out
