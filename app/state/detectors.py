"""The detector set for the loaded model (:func:`core.pipeline.sets.load_set`: one rule for the
app and every command; loaded once, reloaded when its files change)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from core.pipeline.sets import ArtifactCard, BrokenArtifact, DetectorSet, load_set

if TYPE_CHECKING:
    from core.engine.model import LoadedModel

__all__ = ["ArtifactCard", "BrokenArtifact", "DetectorSet", "detector_set"]


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
