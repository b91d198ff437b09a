"""The analysis of one answer: render -> trace -> surprisal (kept per model and input)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from app.state.memo import Memo
from core.base.examples import RAGExample
from core.engine.layout import render
from core.engine.trace import Trace, response_needs, token_surprisal, trace

if TYPE_CHECKING:
    import pandas as pd

    from core.base.examples import RAGExample
    from core.engine.layout import Layout
    from core.engine.model import LoadedModel


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
        dataset: The spec of the dataset whose own answer this is (``None`` for an
            answer written, pasted or changed in the Playground): a link to a page
            showing it names that dataset's example, keeping its id and gold labels.
    """

    example: RAGExample
    layout: Layout
    surprisal: np.ndarray
    trace_seconds: float
    answer_source: str
    model_name: str
    signature: str
    dataset: str | None = None

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


@st.cache_resource(show_spinner=False)
def _analyses() -> Memo[tuple[Layout, np.ndarray, float]]:
    """Every session's analyses: (layout, surprisal, trace seconds) by model and input."""
    return Memo(max_entries=64)


def _key(model: LoadedModel, signature: str) -> tuple[str, str]:
    return model.instance_key, signature


def _analysis(
    model: LoadedModel,
    example: RAGExample,
    sig: str,
    answer_source: str,
    found: tuple[Layout, np.ndarray, float],
) -> Analysis:
    layout, surprisal, seconds = found
    return Analysis(
        example=example,
        layout=layout,
        surprisal=surprisal,
        trace_seconds=seconds,
        answer_source=answer_source,
        model_name=model.info.display_name,
        signature=sig,
    )


def known_analysis(
    model: LoadedModel,
    example: RAGExample,
    *,
    response_ids: Sequence[int] | None = None,
    answer_source: str = "pasted",
) -> Analysis | None:
    """The analysis of this input when some page already computed it, else ``None``."""
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    sig = input_signature(example, ids)
    found = _analyses().get(_key(model, sig))
    return _analysis(model, example, sig, answer_source, found) if found is not None else None


def remember_traced(
    model: LoadedModel,
    example: RAGExample,
    tr: Trace,
    *,
    response_ids: Sequence[int] | None = None,
    answer_source: str = "pasted",
) -> Analysis:
    """The analysis read off a pass that another computation ran (it must hold
    :func:`core.engine.trace.response_needs`), kept for every page: the Playground traces
    the answer once for the surprisal and the detectors together.

    Raises:
        KeyError: The trace lacks the logits at the answer's positions.
        ValueError: ``response_ids`` (the answer's own tokens) are not the traced ones.
    """
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    if ids is not None and tuple(int(i) for i in tr.layout.response_ids) != ids:
        raise ValueError("the trace read other answer tokens than the ones given")
    sig = input_signature(example, ids)
    found = (tr.layout, token_surprisal(tr), tr.seconds)
    _analyses().put(_key(model, sig), found)
    return _analysis(model, example, sig, answer_source, found)


def analyse(
    model: LoadedModel,
    example: RAGExample,
    *,
    response_ids: Sequence[int] | None = None,
    answer_source: str = "pasted",
) -> Analysis:
    """Analyse ``example``'s response with ``model`` (render -> trace -> surprisal),
    kept per model and input for every page and session.

    Raises:
        DataError: The example cannot be laid out (too long, bad response ids, ...).
        ModelError: The forward pass failed.
    """
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    sig = input_signature(example, ids)
    found = _analyses().get(_key(model, sig))
    if found is None:
        layout = render(example, model, response_ids=ids)
        tr = trace(model, layout, response_needs())
        found = (layout, token_surprisal(tr), tr.seconds)
        _analyses().put(_key(model, sig), found)
    return _analysis(model, example, sig, answer_source, found)
