"""Learn: the walkthroughs' widget keys and names, the example sources, the page state
(each walkthrough's step, each example's data) and ReDeEP's data kept for the session."""

from __future__ import annotations

from dataclasses import dataclass, field

import streamlit as st

from core.analysis.heads_layers import HeadStats, HeadView
from core.analysis.teach import FfnLens
from core.base.examples import RAGExample, example_hash
from core.detectors import DETECTORS
from core.detectors.redeep import RedeepTokenDetector

KEY_WALK = "learn.walk"
KEY_SOURCE = "learn.source"
KEY_BACK = "learn.back"
KEY_NEXT = "learn.next"
KEY_TOKEN = "learn.token"
KEY_P_STAY = "learn.p_stay"
KEY_STATS = "learn.stats"
KEY_TRY = "learn.try"

STATE_KEY = "ragscope.learn"
DATASET_N = 24
PRESET_ID = "demo-04-mount-kelsey"  # a hallucinated date in an otherwise supported answer
PRIMER = "Residual stream & logit lens"
REDEEP = "ReDeEP / InterpDetect"
SPAD = "SPAD"
RAGLENS = "RAGLens"
CORTEX = "CORTEX"
WALKS = (PRIMER, REDEEP, SPAD, RAGLENS, CORTEX)
WALK_IDS = {
    "primer": PRIMER,
    "redeep": REDEEP,
    # the one-method walkthroughs are linked by the name of the detector they explain
    DETECTORS.explained("probability-sources"): SPAD,
    DETECTORS.explained("sae-features"): RAGLENS,
    DETECTORS.explained("token-heatmaps"): CORTEX,
}
# A walkthrough's id in a link (``walk=spad``), and its step as a number from 1.
PRESET = "Preset: a clear hallucination"
PLAYGROUND = "The Playground's analysed answer"
EDITED = "The Counterfactual page's edited answer"
LINKED = "The answer the link carries"


@dataclass
class LearnState:
    step: dict[str, int] = field(default_factory=dict)  # walkthrough -> step index
    cache: dict[str, object] = field(default_factory=dict)  # (walk, example sig) -> data


def page_state() -> LearnState:
    if STATE_KEY not in st.session_state:
        st.session_state[STATE_KEY] = LearnState()
    return st.session_state[STATE_KEY]


def signature(ex: RAGExample) -> str:

    return example_hash(ex)


def move(ls: LearnState, walk: str, delta: int, n: int) -> None:
    ls.step[walk] = min(max(ls.step.get(walk, 0) + delta, 0), n - 1)


@dataclass
class RedeepData:
    view: HeadView
    head: tuple[int, int]
    layer: int
    ffn: FfnLens
    detector: RedeepTokenDetector | None  # the shipped redeep_token detector, if any
    stats: HeadStats | None = None  # over the corpus, once computed
