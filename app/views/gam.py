"""GAM shape functions: what RAGLens's explainable boosting model reads from SAE features.

RAGLens encodes every answer token's residual stream with a sparse autoencoder (SAE),
max-pools each SAE feature over the answer, keeps the features that share the most
mutual information with the label and fits an explainable boosting machine (EBM, a
GAM): the answer's log-odds of "hallucinated" is a sum of one learnt function per
feature. This page shows the SAE (and its measured quality), the features ranked by
EBM importance, each feature's shape function over its activation histogram, and one
answer's contributions with the top features' activations per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from app.components.answer_picker import AnswerKeys, pick_page_answer
from app.components.artifacts import show_broken_artifacts
from app.components.exports import plot, whole_table
from app.components.gam_charts import contributions_figure, importance_figure, shape_function_figure
from app.components.heatmap import render_token_heatmap
from app.components.train_job import train_detectors_panel
from app.state.analysis import input_signature
from app.state.detectors import detector_set
from app.state.features import (
    KEY_GAM_DATASET,
    KEY_GAM_EXAMPLE,
    KEY_GAM_FEATURE,
    KEY_GAM_SOURCE,
    KEY_GAM_TOP,
)
from app.state.links import (
    P_FEATURE,
    P_TOP,
    bind,
    feature_id,
    integer,
)
from app.state.model import get_model
from app.state.session import app_state
from app.state.spad_views import train_command
from app.text import code, md
from core.base.errors import RagscopeError
from core.detectors import DETECTORS
from core.detectors.raglens import load_config_sae, sae_folder
from core.engine.layout import render

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.detectors.raglens import RaglensAnswer, RaglensDetector
    from core.engine.model import LoadedModel

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
RAGLENS = DETECTORS.explained("sae-features")
ANSWER_KEYS = AnswerKeys(source=KEY_GAM_SOURCE, dataset=KEY_GAM_DATASET, example=KEY_GAM_EXAMPLE)
ACTIVATION_CMAP = ((0.0, "#ffffff"), (0.35, "#fdd49e"), (0.7, "#fc8d59"), (1.0, "#b30000"))


# --------------------------------------------------------------------------- SAE


def _count(n: object) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def sae_section(model: LoadedModel, detector: RaglensDetector | None) -> None:
    """The SAE the features come from: where, which layer, and its measured quality."""

    spec = detector.config.sae if detector is not None else ""
    folder = sae_folder(spec)
    try:
        sae = load_config_sae(spec)
    except RagscopeError as e:
        st.info(
            f"No SAE for RAGLens yet ({md(e)}). Train one for {md(model.info.display_name)} with "
            "`ragscope sae train` (about an hour on a laptop CPU) and reload this page."
        )
        return
    q = sae.meta.get("quality") or {}
    corpus = (sae.meta.get("corpus") or {}).get("sources") or []
    st.markdown(
        f"**SAE**: {code(folder.name)} · TopK, {sae.d_sae} features on the residual stream "
        f"after block {sae.layer} · trained on {_count(sae.meta.get('activation_tokens'))} "
        f"activation tokens of "
        f"{md(', '.join(str(s.get('name')) for s in corpus)) or 'unrecorded text'}"
    )
    if q:
        cols = st.columns(4)
        cols[0].metric("Variance explained", f"{q['fve']:.3f}", help="held-out tokens")
        cols[1].metric("Mean L0", f"{q['mean_l0']:.1f}", help="active features per token")
        cols[2].metric("Dead features", f"{100 * q['dead_fraction']:.1f}%")
        cols[3].metric(
            "CE increase",
            f"+{q['ce_spliced'] - q['ce_clean']:.3f} nats",
            help="next-token cross-entropy with the SAE's reconstruction spliced in, minus "
            f"the clean model's ({q['ce_clean']:.3f} nats)",
        )
    if sae.model_key is not None and sae.model_key != model.info.key:
        st.warning(
            f"This SAE was trained on another model ({md(sae.model_key)}); RAGLens cannot "
            f"read {md(model.info.display_name)} with it."
        )


# --------------------------------------------------------------------------- global view


def ranking_section(detector: RaglensDetector) -> int | None:
    """The selected features by EBM importance; returns the feature picked for a close-up."""
    import pandas as pd

    state = app_state()
    imp = detector.importances()
    mi = detector.mi_ if detector.mi_ is not None else np.zeros(0)
    n = len(imp)
    left, right = st.columns([2, 3], gap="medium")
    top = bind(
        P_TOP,
        KEY_GAM_TOP,
        lambda: int(left.number_input("Features shown", 1, n, step=5, key=KEY_GAM_TOP)),
        parse=integer(1, n),
        seed=min(20, n),
        default=str(min(20, n)),
        what="number of features",
        where=f"a number from 1 to {n}",
    )
    with left:
        frame = pd.DataFrame(
            {
                "rank": np.arange(1, n + 1),
                "feature": [f"F{k}" for k, _ in imp],
                "importance": [v for _, v in imp],
                "MI (nats)": [float(mi[k]) if k < mi.size else np.nan for k, _ in imp],
            }
        )
        whole_table(  # every feature shown, no inner scroll
            frame.head(top),
            column_config={
                "importance": st.column_config.NumberColumn(format="%.4f"),
                "MI (nats)": st.column_config.NumberColumn(format="%.4f"),
            },
        )
    with right:
        plot(importance_figure(detector, top), key="gam.importance")
    options = [k for k, _ in imp]
    by_id = {feature_id(k): k for k in options}
    remembered = state.gam.feature if state.gam.feature in options else options[0]
    if st.session_state.get(KEY_GAM_FEATURE) not in options:
        st.session_state.pop(KEY_GAM_FEATURE, None)
    rank = {k: i + 1 for i, k in enumerate(options)}
    picked = bind(
        P_FEATURE,
        KEY_GAM_FEATURE,
        lambda: st.selectbox(
            "Feature",
            options,
            key=KEY_GAM_FEATURE,
            format_func=lambda k: f"F{k} (rank {rank[k]})",
        ),
        parse=lambda raw: by_id.get(raw.strip().upper()),
        to_id=lambda k: feature_id(int(k)),
        seed=remembered,
        what="feature",
        where=f"among the {n} SAE features the raglens detector selected",
    )
    state.gam.feature = int(picked)
    return int(picked)


def shape_section(detector: RaglensDetector, feature: int) -> None:

    plot(shape_function_figure(detector, feature), key="gam.shape")
    st.caption(
        "The EBM's learnt contribution of this feature to the log-odds of "
        "\u201challucinated\u201d (zero-centred over the training answers), as a function of "
        "the feature's largest activation over an answer's tokens; below, how many "
        "training answers fell at each activation. Rising to the right: the more the "
        "feature fires somewhere in an answer, the riskier the answer looks."
    )


# --------------------------------------------------------------------------- one answer


@st.cache_data(show_spinner=False, max_entries=32)
def _explain_cached(
    key: str,
    signature: str,
    folder_stamp: str,
    _model: LoadedModel,
    _det: RaglensDetector,
    _example: RAGExample,
) -> RaglensAnswer:
    return _det.explain_answer(_model, _example)


def answer_section(model: LoadedModel, detector: RaglensDetector, stamp: str) -> None:
    """One answer (the Playground's analysed answer first, as on the other one-answer
    pages, else an example of a dataset): its score, the contributions, and where the
    top features fire."""

    state = app_state()
    st.subheader("One answer")
    picked = pick_page_answer(state, state.gam.answer, ANSWER_KEYS)
    if picked is None:
        return
    ex = picked[0]
    try:
        with st.spinner("Tracing the answer and encoding it with the SAE…"):
            ans = _explain_cached(
                model.instance_key, input_signature(ex, None), stamp, model, detector, ex
            )
    except RagscopeError as e:
        st.error(f"This answer could not be analysed: {md(e)}  \nFix: pick another answer.")
        return
    v = ans.verdict
    thr = v.threshold if v.threshold is not None else detector.threshold_
    gold = {True: "hallucinated", False: "faithful", None: "unlabelled"}[ex.label]
    st.markdown(
        f"RAGLens score **{v.score:.3f}** ({v.call} at threshold {thr:.3f}) · "
        f"gold: {gold} · {len(ans.tokens)} answer tokens"
    )
    plot(contributions_figure(v.explanation), key="gam.contrib")
    top = ans.top_positive(3)
    if not top:
        st.info("No selected feature pushes this answer towards \u201challucinated\u201d.")
        return
    labels = None
    if ex.spans:
        labels = render(ex, model).token_labels()
    for k in top:
        acts = ans.activations_of(k)
        peak = float(acts.max()) if acts.size else 0.0
        st.markdown(
            f"**F{k}** · contribution {v.explanation[f'F{k}']:+.3f} log-odds · max activation "
            f"{peak:.3g}"
        )
        if peak <= 0.0:
            st.caption(
                f"F{k} does not fire on any token of this answer, so there is nothing to "
                "colour. Its contribution is the shape function's value at 0: in the "
                "training answers, the *absence* of this feature went with hallucinated "
                "answers. Its shape function above shows the whole curve."
            )
            continue
        render_token_heatmap(
            list(ans.tokens),
            acts.tolist(),
            labels=labels,
            value_name=f"F{k} activation",
            vmin=0.0,
            cmap=ACTIVATION_CMAP,
        )


# --------------------------------------------------------------------------- page


def main() -> None:
    model = get_model()
    st.title("GAM shape functions")
    st.caption(
        "RAGLens reads the answer through a sparse autoencoder (SAE): each SAE feature's "
        "largest activation over the answer tokens, the features most informative about "
        "the label, and an explainable boosting machine that adds one learnt function per "
        "feature. Every number below is the model's own."
    )
    train_detectors_panel(model)
    shipped = detector_set(model)
    found = next((d for d in shipped.detectors if d.name == RAGLENS), None)
    detector = found.detector if found is not None else None
    sae_section(model, detector)  # type: ignore[arg-type]
    show_broken_artifacts(shipped, (RAGLENS,))
    if found is None:
        st.info(
            f"No trained raglens detector for {md(model.info.display_name)}. Make one with "
            f"{code(train_command(RAGLENS, shipped.folder))} (after `ragscope sae train`) and "
            "reload this page."
        )
        return
    facts = [f"trained on {md(found.trained_on)}" if found.trained_on else None]
    facts.append(f"{found.n_train} training answers" if found.n_train else None)
    facts.append(
        f"AUROC {found.auroc:.3f} ({found.auroc_from})" if found.auroc is not None else None
    )
    st.caption("Shipped **raglens** detector: " + ", ".join(f for f in facts if f) + ".")
    st.divider()
    feature = ranking_section(found.detector)  # type: ignore[arg-type]
    if feature is not None:
        shape_section(found.detector, feature)  # type: ignore[arg-type]
    st.divider()
    answer_section(model, found.detector, shipped.cache_id)  # type: ignore[arg-type]


main()
