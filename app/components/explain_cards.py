"""The Feature explanations page's explanation cards: the "Explain top N" row and one card
per feature (facts, explanation, fidelity check, its answers with activating tokens
highlighted)."""

from __future__ import annotations

import streamlit as st

from app.components.explain_endpoint import layout_text
from app.components.explain_sae import SaeChoice
from app.components.heatmap import ColorStops, render_token_heatmap
from app.state.datasets import get_store
from app.state.features import (
    KEY_EXPLAIN_RUN,
    KEY_EXPLAIN_STOP,
    KEY_EXPLAIN_TOP_N,
    batch_outcome,
    explain_one_key,
    fidelity_key,
    fit_top_n,
    request_stop,
    settle_stop,
)
from app.state.session import AppState, seed_widget
from app.text import code, md
from core.base.errors import DataError, LLMError, RagscopeError
from core.base.llm import LLMEndpoint
from core.base.words import plural
from core.engine.model import LoadedModel
from core.explain import (
    ExplainPrompt,
    Explanation,
    FeatureExample,
    FeatureExamples,
    PromptBudget,
    build_prompt,
    cached_explanation,
    explain_feature,
    explain_many,
    fidelity,
)

ACTIVATION_CMAP: ColorStops = ((0.0, "#ffffff"), (0.4, "#d9c8f0"), (1.0, "#5b2a9e"))


# --------------------------------------------------------------------------- explain


def batch_row(
    state: AppState,
    model: LoadedModel,
    endpoint: LLMEndpoint | None,
    items: list[FeatureExamples],
    budget: PromptBudget | None,
) -> None:
    """The "Explain top N" row, with progress and a Stop button; the outcome shows once."""
    settle_stop(state.explain)
    n_max = max(len(items), 1)
    fit_top_n(state.explain, n_max)
    seed_widget(KEY_EXPLAIN_TOP_N, state.explain.top_n)
    c_n, c_button, c_note = st.columns([1, 1.2, 3], vertical_alignment="bottom")
    with c_n:
        state.explain.top_n = int(
            st.number_input("N", min_value=1, max_value=n_max, key=KEY_EXPLAIN_TOP_N)
        )
    with c_button:
        run = st.button(
            "Explain top N",
            key=KEY_EXPLAIN_RUN,
            icon=":material/auto_awesome:",
            disabled=endpoint is None or not items,
            width="stretch",
            help="Explain the first N features below (cached ones cost no request)",
        )
    with c_note:
        st.caption(
            "One request per feature not yet explained for these examples; explanations "
            "are cached in the database."
        )
    if run and endpoint is not None:
        state.explain.outcome = _run_batch(state, model, endpoint, items, budget)
    if state.explain.outcome is not None:
        kind, text = state.explain.outcome
        {"error": st.error, "info": st.info, "success": st.success}[kind](text)
        state.explain.outcome = None


def _run_batch(
    state: AppState,
    model: LoadedModel,
    endpoint: LLMEndpoint,
    items: list[FeatureExamples],
    budget: PromptBudget | None,
) -> tuple[str, str]:
    """Explain the first top-N ``items`` with progress and a Stop button; the outcome."""
    stop_slot = st.empty()
    stop_slot.button(
        "Stop",
        key=KEY_EXPLAIN_STOP,
        icon=":material/stop:",
        on_click=request_stop,
        args=(state.explain,),
    )
    bar = st.progress(0.0, text="Explaining…")

    def progress(done: int, total: int) -> None:
        bar.progress(done / max(total, 1), text=f"Explained {done} / {total}")

    result = explain_many(
        endpoint,
        model.info.key,
        items[: state.explain.top_n],
        store=get_store(),
        progress=progress,
        should_stop=lambda: state.explain.stop,
        budget=budget,
    )
    bar.empty()
    stop_slot.empty()
    return batch_outcome(result)


def show_examples(title: str, shown: tuple[FeatureExample, ...], feature: int, top: float) -> None:
    """The answers of one group, activating tokens highlighted (scale shared by the card)."""
    with st.expander(f"{title} ({len(shown)})", expanded=False):
        if not shown:
            st.caption("None.")
        for i, ex in enumerate(shown):
            st.caption(f"{code(ex.example_id)} · peak {ex.max_activation:.3f}")
            render_token_heatmap(
                ex.tokens,
                ex.activations,
                value_name=f"F{feature} activation",
                vmin=0.0,
                vmax=top,
                cmap=ACTIVATION_CMAP,
                legend=i == len(shown) - 1,
            )


def show_explanation(expl: Explanation | None, fx: FeatureExamples) -> None:
    if expl is None:
        st.caption("No explanation cached for these examples yet.")
        return
    st.markdown(f"**Explanation:** {md(expl.description)}")  # an LLM's words: text only
    notes = []
    if expl.hallucination is not None:
        why = f" — {md(expl.reason)}" if expl.reason else ""
        notes.append(f"Related to hallucination: **{md(expl.hallucination)}**{why}")
    if expl.prompt is not None:
        notes.append(f"written from {layout_text(expl.prompt, fx)}")
    if notes:
        st.caption(" · ".join(notes))


def _card_title(choice: SaeChoice, fx: FeatureExamples) -> None:
    """The card's title and its facts (raglens rank, answers it fires on, peak)."""
    k = fx.feature
    rank = {f: i + 1 for i, (f, _) in enumerate(choice.ranked)}
    facts = [f"fires on {fx.n_firing} of {fx.n_examples} {plural(fx.n_examples, 'answer')}"]
    if k in rank:
        facts.insert(0, f"raglens #{rank[k]}")
    if fx.n_firing:
        facts.append(f"peak {float(fx.max_activations.max()):.3f}")
    st.markdown(f"#### F{k}")
    st.caption(" · ".join(facts))


def _card_prompt(
    endpoint: LLMEndpoint | None, fx: FeatureExamples, budget: PromptBudget | None
) -> ExplainPrompt | None:
    """The prompt the explainer would be asked with (``None``: no explainer, or the
    examples do not fit it, which is shown)."""
    if endpoint is None:
        return None
    try:
        return build_prompt(fx, budget=budget)
    except DataError as e:
        st.error(f"F{fx.feature} cannot be explained by this explainer: {md(e)}")
    return None


def _from_more(expl: Explanation | None, prompt: ExplainPrompt | None) -> bool:
    """Whether the cached explanation was written from a smaller prompt than this one."""
    # A cached explanation from a smaller prompt can be rewritten from this larger one.
    return (
        expl is not None
        and prompt is not None
        and expl.prompt is not None
        and prompt.hash != expl.prompt_hash
        and (prompt.n_shown, prompt.window or 10**9)
        > (expl.prompt.n_shown, expl.prompt.window or 10**9)
    )


def _card_buttons(
    endpoint: LLMEndpoint | None,
    fx: FeatureExamples,
    expl: Explanation | None,
    prompt: ExplainPrompt | None,
) -> tuple[bool, bool]:
    """The card's "Explain" and "Check fidelity" buttons; whether each was pressed."""
    k = fx.feature
    more = _from_more(expl, prompt)
    c_explain, c_fid, _ = st.columns([1.3, 1, 2.7])
    with c_explain:
        ask = st.button(
            "Explain from more answers" if more else "Explain",
            key=explain_one_key(k),
            icon=":material/auto_awesome:",
            disabled=prompt is None or (expl is not None and not more),
            width="stretch",
            help=f"Asks the explainer with {layout_text(prompt, fx)}" if prompt else None,
        )
    with c_fid:
        check = st.button(
            "Check fidelity",
            key=fidelity_key(k),
            icon=":material/rule:",
            disabled=endpoint is None or not fx.held_out,
            width="stretch",
            help="The LLM predicts this feature (0-5 per token) on held-out answers from "
            "the explanation alone; the score is the Pearson r with the real activations",
        )
    return ask, check


def _check_fidelity(
    state: AppState,
    endpoint: LLMEndpoint,
    expl: Explanation | None,
    fx: FeatureExamples,
    budget: PromptBudget | None,
) -> None:
    """Run the fidelity check of the card's explanation (kept by its prompt hash)."""
    k = fx.feature
    if expl is None:
        st.warning("Explain the feature first; the fidelity check reads its explanation.")
        return
    try:
        with st.spinner(f"Asking {md(endpoint.model)} to predict F{k}…"):
            state.explain.fidelity[expl.prompt_hash] = fidelity(
                endpoint, expl, fx.held_out, budget=budget
            )
    except (LLMError, DataError) as e:
        st.error(f"The fidelity check of F{k} failed: {md(e)}")


def _show_fidelity(state: AppState, expl: Explanation | None) -> None:
    """The explanation's fidelity score, when it was checked."""
    fid = state.explain.fidelity.get(expl.prompt_hash) if expl is not None else None
    if fid is None:
        return
    r = "undefined (constant predictions or activations)" if fid.r != fid.r else f"{fid.r:+.2f}"
    unread = f"; {fid.n_unread} answer(s) got no prediction" if fid.n_unread else ""
    st.markdown(
        f"**Fidelity:** Pearson r = {r} over {fid.n_tokens} tokens of "
        f"{len(fid.example_ids)} held-out answers{unread}."
    )


def feature_card(
    state: AppState,
    model: LoadedModel,
    endpoint: LLMEndpoint | None,
    choice: SaeChoice,
    fx: FeatureExamples,
    budget: PromptBudget | None,
) -> None:
    """One feature: facts, explanation (cached or on request), fidelity, examples."""
    k = fx.feature
    with st.container(border=True):
        _card_title(choice, fx)
        if not fx.n_firing:
            st.caption(f"F{k} fires on none of these answers: nothing to show or explain.")
            return
        store = get_store()
        expl = cached_explanation(model.info.key, fx, store=store)
        prompt = _card_prompt(endpoint, fx, budget)
        ask, check = _card_buttons(endpoint, fx, expl, prompt)
        if ask and endpoint is not None:
            try:
                with st.spinner(f"Asking {md(endpoint.model)}…"):
                    explain_feature(
                        endpoint, model.info.key, fx.sae_key, k, fx, store=store, budget=budget
                    )
            except RagscopeError as e:
                st.error(f"F{k} could not be explained: {md(e)}")
            else:
                st.rerun()  # cached now: the card redraws with it (and its button's new state)
        show_explanation(expl, fx)
        if check and endpoint is not None:
            _check_fidelity(state, endpoint, expl, fx, budget)
        _show_fidelity(state, expl)
        top = max(e.max_activation for e in fx.shown)
        show_examples("Top-activating answers", fx.top, k, top)
        show_examples("Quantile sample", fx.quantile, k, top)
