"""The SAE the Feature explanations page explains, and where its features come from.

The shipped raglens detector's SAE, its selected features ranked by EBM importance;
else the shipped SAE, its features picked by id (``specs/raglens.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.components.artifacts import show_broken_artifacts
from app.state.detectors import ArtifactCard, detector_set
from app.state.features import RAGLENS
from app.state.model import model_spec
from app.state.spad_views import shown_folder, train_command
from app.text import md
from core.base.errors import DataError, ModelError
from core.base.paths import shipped_sae_dir
from core.detectors.raglens import RaglensConfig, RaglensDetector, load_config_sae
from core.engine.model import LoadedModel
from core.signals.sae import LoadedSAE


@dataclass(frozen=True, kw_only=True, eq=False)
class SaeChoice:
    """The SAE the page explains and where its features come from."""

    sae: LoadedSAE
    activation: str
    raglens: ArtifactCard | None
    ranked: tuple[tuple[int, float], ...]  # (feature, EBM importance), most important first


def sae_train_command(model: LoadedModel) -> str:
    """The ``ragscope sae train`` command that makes the SAE this page looks for."""

    spec = model_spec()
    if spec == "embedded":
        return "ragscope sae train"
    return f"ragscope sae train --model {spec} --out {shown_folder(shipped_sae_dir())}"


def choose_sae(model: LoadedModel) -> SaeChoice | None:
    """The shipped raglens detector's SAE, else the shipped SAE (notices when missing).

    A raglens detector trained on the raw residual stream (``raw_layer``) has no SAE
    features to rank: the shipped SAE is shown, features picked by id.
    """

    shipped = detector_set(model)
    show_broken_artifacts(shipped, (RAGLENS,))
    raglens = next((d for d in shipped.detectors if d.name == RAGLENS), None)
    raw = raglens is not None and bool(getattr(raglens.detector, "raw", False))
    make_raglens = train_command(RAGLENS, shipped.folder)
    try:
        if raglens is not None and not raw:
            det = raglens.detector
            assert isinstance(det, RaglensDetector)  # the registry's class for RAGLENS
            sae = det.sae
            ranked = tuple(det.importances())
            return SaeChoice(
                sae=sae, activation=det.config.activation, raglens=raglens, ranked=ranked
            )
        sae = load_config_sae("")
        sae.check_model(model.info.key, model.info.d_model)
    except DataError as e:
        st.info(
            f"**No SAE for {md(model.info.display_name)}.** RAGLens reads the features of a "
            f"sparse autoencoder on the residual stream; train one with "
            f"`{sae_train_command(model)}`"
            + ("" if model_spec() == "embedded" else " and point `RAGSCOPE_SAE_DIR` at it")
            + f", then the detector with `{make_raglens}`, and reload this page.  \n"
            f"({md(e)})",
            icon=":material/info:",
        )
        return None
    except ModelError as e:
        st.warning(
            f"The SAE does not fit {md(model.info.display_name)}: {md(e)}",
            icon=":material/warning:",
        )
        return None
    why = (
        "The shipped **raglens** detector reads the raw residual stream, not SAE features"
        if raw
        else f"No trained **raglens** detector for {md(model.info.display_name)}"
    )
    st.info(
        f"{why}, so features are picked by id below. Make one on the SAE with "
        f"`{make_raglens}` to list the features it selected, by EBM importance.",
        icon=":material/info:",
    )
    activation = RaglensConfig().activation  # what a raglens detector trained now reads
    return SaeChoice(sae=sae, activation=activation, raglens=None, ranked=())
