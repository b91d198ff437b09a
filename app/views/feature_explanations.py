"""Feature explanations: what the SAE features RAGLens reads respond to, in words.

RAGLens (``specs/raglens.md``) max-pools the activations of a sparse autoencoder's
features over the answer and keeps the few that carry information about
hallucination. This page shows, for each picked feature, the answers where it fires
hardest and a quantile-spread sample of the others (activating tokens highlighted),
and an LLM-written one-sentence explanation, cached in the database. An optional
fidelity check asks the LLM to predict the feature on held-out answers from the
explanation alone and reports the Pearson r with the real activations.

Features default to those the shipped raglens detector selected, by EBM importance;
without one, feature ids are typed in. The explainer is any OpenAI-compatible chat
endpoint, configured by environment variables or ``.streamlit/secrets.toml``
(:data:`core.explain.SETTING_NAMES`); without one, cached explanations still show.
"""

from __future__ import annotations

import re
import time

import streamlit as st

from app.components.estimate import estimate_caption, progress_bar
from app.components.example_picker import (
    ExampleKeys,
    PickedExamples,
    pick_examples,
    split_label,
)
from app.components.explain_cards import batch_row, feature_card
from app.components.explain_endpoint import endpoint_section, prompt_budget
from app.components.explain_sae import SaeChoice, choose_sae
from app.components.train_job import train_detectors_panel
from app.state.estimates import paced_read, record_shown, sae_read_estimate
from app.state.features import (
    KEY_EXPLAIN_FEATURES,
    KEY_EXPLAIN_IDS,
    KEY_EXPLAIN_LIMIT,
    KEY_EXPLAIN_READ,
    KEY_EXPLAIN_SOURCE,
    KEY_EXPLAIN_SPLIT,
    ExplainRequest,
    sae_feature_examples,
)
from app.state.heads import ALL_SPLITS, heads_examples
from app.state.links import P_FEATURE, feature_id, follow_features, publish
from app.state.model import get_model
from app.state.session import AppState, app_state, seed_widget
from app.text import md
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.base.llm import LLMEndpoint
from core.base.words import plural
from core.engine.model import LoadedModel
from core.explain import active_features, encode_answers

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
MAX_EXAMPLES = 400  # each answer costs one forward pass the first time
DEFAULT_FEATURES = 8
EXAMPLE_KEYS = ExampleKeys(
    source=KEY_EXPLAIN_SOURCE, split=KEY_EXPLAIN_SPLIT, limit=KEY_EXPLAIN_LIMIT
)


# --------------------------------------------------------------------------- answers


def read_row(
    state: AppState, model: LoadedModel, choice: SaeChoice, picked: PickedExamples
) -> bool:
    """What the picked answers are, beside the button that reads their SAE activations;
    whether they were read on this run."""
    chosen = picked.chosen
    selection = state.explain.selection
    c_note, c_button = st.columns([4, 1], vertical_alignment="center")
    with c_note:
        st.caption(
            f"{len(chosen)} of the {len(picked.pool)} {plural(len(picked.pool), 'example')} "
            f"({split_label(selection.split)}) "
            f"of {md(picked.label)}. Each answer costs one forward pass up to block "
            f"{choice.sae.layer} the first time; later reads come from memory."
        )
        slot = st.empty()
    with c_button:
        read = st.button(
            "Read activations",
            key=KEY_EXPLAIN_READ,
            type="primary",
            icon=":material/query_stats:",
            disabled=not chosen,
            width="stretch",
        )
    if not read:
        if chosen:
            estimate_caption(
                lambda: sae_read_estimate(model, choice.sae, chosen, choice.activation),
                kept="this server's memory",
                where=slot,
            )
        return False
    timed = paced_read(model, choice.sae, chosen, choice.activation)
    with progress_bar("SAE activations:") as progress:
        try:
            with timed as pacer:
                got = encode_answers(
                    model,
                    choice.sae,
                    chosen,
                    activation=choice.activation,  # type: ignore[arg-type]
                    progress=pacer.ticking(progress),
                    on_error="skip",
                )
        except RagscopeError as e:
            st.error(f"The activations could not be read: {md(e)}")
            return False
    state.explain.request = ExplainRequest(
        model=model.info.key,
        sae_key=choice.sae.key,
        activation=choice.activation,
        source=selection.source,
        dataset_key=picked.key,
        dataset_label=picked.label,
        split=selection.split or ALL_SPLITS,
        limit=selection.limit,
        ids=tuple(e.id for e in got.examples),
        errors=got.errors[:3],
        n_failed=len(got.errors),
        computed=got.computed,
        seconds=got.seconds,
    )
    return True


def current_request(
    state: AppState, model: LoadedModel, choice: SaeChoice, picked: PickedExamples
) -> ExplainRequest | None:
    """The last read, when it fits the model and the SAE (notes when it is stale)."""
    req = state.explain.request
    if req is None or (req.model, req.sae_key, req.activation) != (
        model.info.key,
        choice.sae.key,
        choice.activation,
    ):
        st.info("Press **Read activations** to find where the features fire.")
        return None
    selection = state.explain.selection
    chosen = (picked.key, selection.split or ALL_SPLITS, selection.limit)
    if (req.dataset_key, req.split, req.limit) != chosen:
        st.info(
            f"Showing {len(req.ids)} {plural(len(req.ids), 'answer')} of "
            f"{md(req.dataset_label)} "
            f"({split_label(req.split)}); "
            "press **Read activations** for the choice above."
        )
    if req.n_failed:
        st.warning(
            f"{req.n_failed} example(s) could not be read and were left out: "
            + " · ".join(md(e) for e in req.errors)
        )
    if not req.ids:
        st.warning("None of the examples could be read; pick other examples.")
        return None
    return req


# --------------------------------------------------------------------------- features


def parse_ids(text: str, d_sae: int) -> tuple[list[int], list[str]]:
    """Feature ids in ``text`` (any separators) and the tokens that are not valid ids."""
    ids: list[int] = []
    bad: list[str] = []
    for tok in re.split(r"[\s,;]+", text.strip()):
        if not tok:
            continue
        k = int(tok[1:]) if tok[:1] in "Ff" and tok[1:].isdigit() else None
        k = int(tok) if tok.isdigit() else k
        if k is None or not 0 <= k < d_sae:
            bad.append(tok)
        elif k not in ids:
            ids.append(k)
    return ids, bad


def _feature_list(ids: list[int]) -> str:
    return ",".join(feature_id(k) for k in ids)


def pick_features(state: AppState, choice: SaeChoice) -> list[int]:
    """The features to show: picked from raglens's ranking, else typed in (empty: none
    typed, the caller shows the most active ones); their ids in the URL."""
    if choice.ranked:
        rank = {k: (i + 1, imp) for i, (k, imp) in enumerate(choice.ranked)}
        options = [k for k, _ in choice.ranked]
        link = follow_features(P_FEATURE, rank.__contains__)
        if link.value is not None:
            state.explain.features = link.value
            st.session_state[KEY_EXPLAIN_FEATURES] = link.value
        if state.explain.features is None or not set(state.explain.features) <= set(options):
            state.explain.features = options[:DEFAULT_FEATURES]
            st.session_state.pop(KEY_EXPLAIN_FEATURES, None)
        seed_widget(KEY_EXPLAIN_FEATURES, state.explain.features)
        state.explain.features = st.multiselect(
            "Features",
            options,
            key=KEY_EXPLAIN_FEATURES,
            format_func=lambda k: f"F{k} · #{rank[k][0]} (importance {rank[k][1]:.3f})",
            help="The SAE features the raglens detector selected, most important first",
        )
        publish(
            P_FEATURE,
            _feature_list(state.explain.features),
            default=_feature_list(options[:DEFAULT_FEATURES]),
            missing=link.missing,
            what="feature",
            where=f"among the {len(options)} SAE features the raglens detector selected",
            instead=md(_feature_list(state.explain.features) or "no feature"),
        )
        return list(state.explain.features)
    d_sae = choice.sae.d_sae
    link = follow_features(P_FEATURE, lambda k: 0 <= k < d_sae)
    if link.value is not None:
        state.explain.ids = ", ".join(str(k) for k in link.value)
        st.session_state[KEY_EXPLAIN_IDS] = state.explain.ids
    seed_widget(KEY_EXPLAIN_IDS, state.explain.ids)
    state.explain.ids = st.text_input(
        "SAE features",
        key=KEY_EXPLAIN_IDS,
        placeholder="e.g. 12, 305, 1877 (empty: the features that fire on the most answers)",
        help=f"Feature ids from 0 to {d_sae - 1}, separated by commas or spaces. "
        "Empty: the features that fire on the most answers read.",
    )
    ids, bad = parse_ids(state.explain.ids, d_sae)
    if bad:
        st.warning(f"Not feature ids of this SAE (0 to {d_sae - 1}): {md(', '.join(bad))}")
    publish(
        P_FEATURE,
        _feature_list(ids) or None,
        missing=link.missing,
        what="feature",
        where=f"a feature of this SAE (F0 to F{d_sae - 1})",
        instead=md(_feature_list(ids) or "the features that fire on the most answers"),
    )
    return ids


def most_active(model: LoadedModel, choice: SaeChoice, examples: list[RAGExample]) -> list[int]:
    """The features that fire on the most of ``examples`` (when none are typed in)."""
    ids = active_features(
        model,
        choice.sae,
        examples,
        activation=choice.activation,  # type: ignore[arg-type]
        n=DEFAULT_FEATURES,
    )
    st.caption(
        f"Showing the {len(ids)} features that fire on the most of these answers; type ids "
        "above to pick others."
    )
    return ids


# --------------------------------------------------------------------------- page


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Feature explanations")
    st.caption(
        "RAGLens reads the features of a sparse autoencoder (SAE) on the residual stream, "
        "max-pooled over the answer. What does each feature it relies on respond to? Here: "
        "the answers where it fires, its activating tokens highlighted, and a one-sentence "
        "explanation written by an LLM from those examples."
    )
    train_detectors_panel(model)
    choice = choose_sae(model)
    if choice is None:
        return
    st.caption(
        f"SAE `{choice.sae.name}`: {choice.sae.d_sae} features on the residual stream after "
        f"block {choice.sae.layer} ({choice.activation} activations)."
    )
    endpoint = endpoint_section()
    st.divider()
    picked = pick_examples(
        state.explain.selection,
        state.dataset,
        EXAMPLE_KEYS,
        st.columns([2.6, 1.1, 1], vertical_alignment="bottom"),
        default_split=ALL_SPLITS,
        max_limit=MAX_EXAMPLES,
        limit_help="Answers to read; each costs one forward pass the first time",
    )
    if picked is None:
        return
    features = pick_features(state, choice)
    just_read = read_row(state, model, choice, picked)
    t0 = time.perf_counter()
    shown = show_features(state, model, choice, picked, features, endpoint)
    if just_read and shown:
        # what the page does after a read counts towards the next read's estimate
        record_shown(model, choice.sae, choice.activation, shown, time.perf_counter() - t0)


def show_features(
    state: AppState,
    model: LoadedModel,
    choice: SaeChoice,
    picked: PickedExamples,
    features: list[int],
    endpoint: LLMEndpoint | None,
) -> int:
    """Each feature's top answers among those read, with its card; how many answers were
    read (0: nothing shown)."""
    req = current_request(state, model, choice, picked)
    if req is None:
        return 0
    try:
        pool = (
            picked.examples
            if req.dataset_key == picked.key
            else heads_examples(req.source, state.dataset)[2]
        )
    except RagscopeError as e:
        st.error(f"{md(req.dataset_label)} cannot be read: {md(e)}")
        return 0
    by_id = {e.id: e for e in pool}
    examples = [by_id[i] for i in req.ids if i in by_id]
    if not features and not choice.ranked:
        features = most_active(model, choice, examples)
    if not features:
        st.info("No feature to show: pick some above.")
        return 0
    try:
        items = [sae_feature_examples(model, choice.sae, req, pool, k) for k in features]
    except RagscopeError as e:
        st.error(f"The features' examples could not be read: {md(e)}")
        return 0
    budget = prompt_budget(model, endpoint)
    batch_row(state, model, endpoint, items, budget)
    for fx in items:
        feature_card(state, model, endpoint, choice, fx, budget)
    return len(examples)


main()
