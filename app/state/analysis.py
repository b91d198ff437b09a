"""The analysis of one answer: render -> trace -> surprisal (cached)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from core.examples import RAGExample
from core.layout import render
from core.trace import response_needs, token_surprisal, trace

if TYPE_CHECKING:
    import pandas as pd

    from core.examples import RAGExample
    from core.layout import Layout
    from core.model import LoadedModel


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
