"""Gold labels: per answer (``response_labels``) and per token (``span_labels``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample


def span_labels(offsets: np.ndarray | None, example: RAGExample) -> np.ndarray | None:
    """Gold label per token of ``offsets`` (``[n, 2]`` character ranges): 1 when it
    overlaps a hallucinated span; ``None`` without offsets or spans."""
    if offsets is None or not example.spans:
        return None
    o = np.asarray(offsets)
    lab = np.zeros(o.shape[0], dtype=np.int8)
    for s in example.spans:
        lab |= ((o[:, 0] < s.end) & (s.start < o[:, 1])).astype(np.int8)
    return lab


def response_labels(examples: Sequence[RAGExample]) -> np.ndarray:
    """Gold response labels (1 = hallucinated); every example must be labelled."""
    missing = [ex.id for ex in examples if ex.label is None]
    if missing:
        raise DataError(
            f"{len(missing)} training examples have no label (first: {missing[0]!r}); "
            "train on a labelled dataset",
            field="label",
        )
    return np.asarray([int(bool(ex.label)) for ex in examples], dtype=np.int64)
