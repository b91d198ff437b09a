"""The detector set for the loaded model (:func:`core.pipeline.sets.load_set`: one rule for the
app and every command; loaded once, reloaded when its files change)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import streamlit as st

from app.text import md
from core.pipeline.sets import ArtifactCard, BrokenArtifact, DetectorSet, load_set

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel

__all__ = ["ArtifactCard", "BrokenArtifact", "DetectorSet", "detector_set", "set_in_use"]


@st.cache_resource(show_spinner="Loading the trained detectors…", max_entries=8)
def _loading(model_key: str) -> None:
    """Shows the spinner while the first session loads the set for ``model_key`` (the
    set itself is kept by :func:`core.pipeline.sets.load_set`, which reloads it when it changes)."""
    load_set(model_key)


def detector_set(model: LoadedModel) -> DetectorSet:
    """The detector set that judges answers for ``model`` (:func:`core.pipeline.sets.load_set`:
    a set named by ``RAGSCOPE_DETECTORS_DIR`` / ``RAGSCOPE_DETECTOR_SET``, else the
    shipped default; the set trained on this machine when that has nothing for the
    model). A broken artifact does not raise: it is listed in
    :attr:`~core.pipeline.sets.DetectorSet.broken` and the others still load."""
    _loading(model.info.key)
    return load_set(model.info.key)


def set_in_use(shipped: DetectorSet, examples: Sequence[RAGExample]) -> str:
    """The sidebar's line naming the set that judges ``examples`` (the dataset picked on
    Home) by core's rule (:meth:`~core.pipeline.sets.DetectorSet.for_examples`): the
    loaded set itself, or the expert or adapted set it defers to for that dataset, with
    its id (:attr:`~core.pipeline.sets.DetectorSet.set_id`)."""
    judging = shipped.for_examples(examples)
    head = f"**Detectors:** {md(shipped.name)} set · {len(shipped.detectors)} for this model"
    if judging is shipped:
        return f"{head}  \nSet in use: `{judging.set_id}`"
    dataset = examples[0].provenance.dataset if examples else None
    how = (
        f"adapted from {judging.adapted.n_reviews} reviews"
        if judging.adapted is not None
        else "its expert"
    )
    return (
        f"{head}  \n**Judging {md(dataset or 'this dataset')}:** the {md(judging.name)} set "
        f"({how})  \nSet in use: `{judging.set_id}`"
    )
