"""Learn: what every walkthrough shares, the colour scales of its token heatmaps and its
last step, "Try it" (edit the answer's context on the Counterfactual page)."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from app.components.answer_picker import open_in_counterfactual
from app.state.datasets import BUILTIN, DEMO_FULL_REF
from app.state.heads import HEADS_FROM_HOME
from app.state.learn import KEY_SOURCE, KEY_TRY, PLAYGROUND, PRESET_ID
from app.state.session import app_state

Step = tuple[str, Callable[[], None]]
"""A walkthrough step: its title and what draws it."""

PROB_CMAP = ((0.0, "#ffffff"), (0.5, "#9ecae1"), (1.0, "#08519c"))
SCORE_CMAP = ((0.0, "#ffffff"), (0.5, "#f4b183"), (1.0, "#c0392b"))
COUNTERFACTUAL_PAGE = "views/counterfactual.py"


def try_it() -> None:

    st.markdown(
        "Change the passages and watch these numbers move: support the flagged claim in "
        "a passage (the flags should fade) or state it differently (they should stay). The "
        "Counterfactual context page does the edit and re-reads the answer with every "
        "detector."
    )
    state = app_state()
    source = st.session_state.get(KEY_SOURCE)
    if source == PLAYGROUND and (state.linked_answer or state.analysis) is not None:
        target: dict[str, str] | None = {}
    elif state.dataset in (BUILTIN, DEMO_FULL_REF):  # the preset is one of Home's examples
        target = {"dataset": HEADS_FROM_HOME, "example_id": PRESET_ID}
    else:
        target = None
    if target is None:
        st.page_link(COUNTERFACTUAL_PAGE, label="Edit the context", icon=":material/edit_note:")
    elif st.button("Edit this answer's context", key=KEY_TRY, icon=":material/edit_note:"):
        open_in_counterfactual(state, **target)
