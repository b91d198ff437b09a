"""Learn: guided walkthroughs of how the detectors read the model, live on one answer.

Each walkthrough is a short sequence of steps (Back / Next, a progress bar), each a
live view of the current example (the Playground's analysed answer, a preset with a
clear hallucination, or the Counterfactual page's edited version), a few sentences
of plain language and the formula it computes. Every number shown comes from the model (:mod:`core.analysis.teach`), computed
once per example and kept for the session. Walkthroughs: the shared primer (the
residual stream read with the logit lens), ReDeEP / InterpDetect, SPAD, RAGLens and
CORTEX.
"""

from __future__ import annotations

import streamlit as st

from app.components.answer_picker import playground_answer
from app.components.learn_cortex import cortex_steps
from app.components.learn_primer import primer_steps
from app.components.learn_raglens import raglens_steps
from app.components.learn_redeep import redeep_data, redeep_steps
from app.components.learn_spad import SpadData, spad_steps
from app.state.detectors import detector_set
from app.state.learn import (
    CORTEX,
    EDITED,
    KEY_BACK,
    KEY_NEXT,
    KEY_SOURCE,
    KEY_WALK,
    LINKED,
    PLAYGROUND,
    PRESET,
    PRESET_ID,
    PRIMER,
    RAGLENS,
    REDEEP,
    SPAD,
    WALK_IDS,
    WALKS,
    LearnState,
    move,
    page_state,
    signature,
)
from app.state.links import (
    P_INPUT,
    P_STEP,
    P_WALK,
    bind,
    example_input,
    follow,
    integer,
    linked,
    publish,
)
from app.state.model import get_model
from app.state.session import app_state
from app.state.spad_views import answer_sources
from app.text import md
from core.analysis.teach import cortex_walk, lens_curve, raglens_walk
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.data import builtin_examples
from core.detectors import DETECTORS
from core.detectors.cortex import CortexDetector
from core.detectors.raglens import RaglensDetector
from core.detectors.spad import SpadDetector


def current_example() -> RAGExample | None:
    """The example the walkthrough reads: the Playground's answer (or the one a link
    carries), the Counterfactual page's edited version (to watch a step change with the
    context), or the preset. An answer other than the preset travels in the URL as
    ``input``, so a copied link reopens it in a fresh browser."""

    state = app_state()
    carried = linked(P_INPUT) is not None
    answer = playground_answer(state)
    cf = state.cf.result
    options = (
        ([PLAYGROUND] if answer is not None else [])
        + ([EDITED] if cf is not None else [])
        + [PRESET]
    )
    if carried and answer is not None:
        st.session_state[KEY_SOURCE] = PLAYGROUND
    if st.session_state.get(KEY_SOURCE) not in options:
        st.session_state.pop(KEY_SOURCE, None)
    names = {
        PLAYGROUND: PLAYGROUND if state.linked_answer is None else LINKED,
        EDITED: EDITED,
        PRESET: PRESET,
    }
    source = st.radio(
        "Example", options, horizontal=True, key=KEY_SOURCE, format_func=names.__getitem__
    )
    ex: RAGExample | None
    if source == PLAYGROUND and answer is not None:
        ex = answer
    elif source == EDITED and cf is not None:
        st.caption(f"Edited on the Counterfactual context page: “{md(cf.name)}”.")
        ex = cf.edited
    else:
        ex = next((e for e in builtin_examples() if e.id == PRESET_ID), None)
        if ex is None:
            st.error(f"The preset example {PRESET_ID!r} is missing from the built-in examples.")
    shown = None if ex is None or source == PRESET else example_input(ex)
    publish(P_INPUT, shown, what="answer", where="readable")
    if ex is not None and source != PRESET and shown is None:
        st.caption("This answer cannot travel in a link (too long, or a verbatim prompt).")
    return ex


def walk_data(ls: LearnState, walk: str, ex: RAGExample) -> object | None:
    """The example's data for a walkthrough, computed once per session."""
    key = f"{walk}|{signature(ex)}"
    if key in ls.cache:
        return ls.cache[key]
    model = get_model()
    shipped = {s.name: s.detector for s in detector_set(model).detectors}
    if walk == PRIMER:
        with st.spinner("Reading every block with the logit lens…"):
            data: object = lens_curve(model, ex)
    elif walk == SPAD:
        with st.spinner("Splitting every token's probability into its sources…"):
            spad = shipped.get(DETECTORS.explained("probability-sources"))
            data = SpadData(
                answer=answer_sources(model, ex),
                detector=spad if isinstance(spad, SpadDetector) else None,
            )
    elif walk == REDEEP:
        with st.spinner("Reading every head and every FFN on the answer…"):
            data = redeep_data(model, ex, shipped)
    else:
        name = DETECTORS.explained("sae-features" if walk == RAGLENS else "token-heatmaps")
        det = shipped.get(name)
        if not isinstance(det, (RaglensDetector, CortexDetector)):
            st.info(
                f"No trained {walk} detector for this model: train one with "
                f"`ragscope train --detectors {name}` to step through it."
            )
            return None
        with st.spinner(f"Reading the answer as {walk} does…"):
            data = (
                raglens_walk(model, det, ex)
                if isinstance(det, RaglensDetector)
                else cortex_walk(model, det, ex)
            )
    ls.cache[key] = data
    return data


def main() -> None:
    st.title("Learn")
    st.caption(
        "How the detectors read the model, step by step, on a live answer: every number "
        "is computed from the model, here and now."
    )
    ls = page_state()
    walk = bind(
        P_WALK,
        KEY_WALK,
        lambda: st.radio("Walkthrough", list(WALKS), horizontal=True, key=KEY_WALK),
        parse=WALK_IDS.get,
        to_id=lambda w: next(k for k, v in WALK_IDS.items() if v == w),
        default=next(iter(WALK_IDS)),
        what="walkthrough",
        where=" or ".join(WALK_IDS),
    )
    ex = current_example()
    if ex is None:
        return
    try:
        data = walk_data(ls, walk, ex)
    except RagscopeError as e:
        st.error(f"This answer cannot be read: {md(e)}")
        return
    if data is None:
        return
    build = {
        PRIMER: primer_steps,
        REDEEP: redeep_steps,
        SPAD: spad_steps,
        RAGLENS: raglens_steps,
        CORTEX: cortex_steps,
    }
    steps = build[walk](data, ex)  # type: ignore[operator]
    n = len(steps)
    step_link = follow(P_STEP, integer(1, n))
    if step_link.value is not None:
        ls.step[walk] = step_link.value - 1
    k = min(ls.step.get(walk, 0), n - 1)
    publish(
        P_STEP,
        str(k + 1),
        default="1",
        missing=step_link.missing,
        what="step",
        where=f"a step from 1 to {n}",
    )
    title, show = steps[k]
    st.progress((k + 1) / n, text=f"Step {k + 1} of {n}: {title}")
    st.subheader(title)
    # One block for the step's content, so Back/Next keep their place in the page
    # from step to step: a rerun replaces them instead of showing a stale pair beside new ones.
    with st.container():
        show()
    c_back, c_next, _ = st.columns([1, 1, 4])
    c_back.button(
        "Back", key=KEY_BACK, icon=":material/arrow_back:", disabled=k == 0,
        on_click=move, args=(ls, walk, -1, n), width="stretch",
    )  # fmt: skip
    c_next.button(
        "Next", key=KEY_NEXT, icon=":material/arrow_forward:", type="primary",
        disabled=k == n - 1, on_click=move, args=(ls, walk, 1, n), width="stretch",
    )  # fmt: skip


main()
