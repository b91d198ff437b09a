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
from dataclasses import dataclass, replace

import streamlit as st

from app.components.artifacts import show_broken_artifacts
from app.components.estimate import estimate_caption, progress_bar
from app.components.example_picker import (
    ExampleKeys,
    PickedExamples,
    pick_examples,
    split_label,
)
from app.components.heatmap import ColorStops, render_token_heatmap
from app.components.train_job import train_detectors_panel
from app.state.datasets import get_store
from app.state.detectors import ShippedDetector, shipped_detectors
from app.state.estimates import paced_read, sae_read_estimate
from app.state.features import (
    KEY_EXPLAIN_FEATURES,
    KEY_EXPLAIN_IDS,
    KEY_EXPLAIN_LIMIT,
    KEY_EXPLAIN_READ,
    KEY_EXPLAIN_RUN,
    KEY_EXPLAIN_SOURCE,
    KEY_EXPLAIN_SPLIT,
    KEY_EXPLAIN_STOP,
    KEY_EXPLAIN_TOP_N,
    RAGLENS,
    ExplainRequest,
    explain_one_key,
    fidelity_key,
    sae_feature_examples,
)
from app.state.heads import ALL_SPLITS, heads_examples
from app.state.links import P_FEATURE, feature_id, follow_features, publish
from app.state.model import get_model, model_spec
from app.state.session import AppState, app_state, seed_widget
from app.state.spad_views import shown_folder, train_command
from app.text import code, md
from core.base.errors import DataError, LLMError, ModelError, RagscopeError
from core.base.examples import RAGExample
from core.base.llm import (
    CONFIG_HELP,
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_CONTEXT,
    ENV_MODEL,
    MIN_CONTEXT,
    SETTING_NAMES,
    LLMEndpoint,
    probe_context,
)
from core.base.paths import shipped_sae_dir
from core.detectors.raglens import RaglensConfig, load_config_sae
from core.engine.model import LoadedModel
from core.explain import (
    ExplainPrompt,
    Explanation,
    FeatureExample,
    FeatureExamples,
    PromptBudget,
    active_features,
    build_prompt,
    cached_explanation,
    encode_answers,
    explain_feature,
    explain_many,
    fidelity,
)
from core.signals.sae import LoadedSAE

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
MAX_EXAMPLES = 400  # each answer costs one forward pass the first time
DEFAULT_FEATURES = 8
EXAMPLE_KEYS = ExampleKeys(
    source=KEY_EXPLAIN_SOURCE, split=KEY_EXPLAIN_SPLIT, limit=KEY_EXPLAIN_LIMIT
)
ACTIVATION_CMAP: ColorStops = ((0.0, "#ffffff"), (0.4, "#d9c8f0"), (1.0, "#5b2a9e"))
SECRETS_EXAMPLE = f"""# .streamlit/secrets.toml (or export the same names as environment variables)
{ENV_BASE_URL} = "http://localhost:11434/v1"   # any OpenAI-compatible server
{ENV_MODEL} = "qwen2.5:7b-instruct"
{ENV_API_KEY} = "..."                           # if the server needs one
{ENV_CONTEXT} = 32768                          # its context in tokens, if the server does not list it
"""


@dataclass(frozen=True, kw_only=True, eq=False)
class SaeChoice:
    """The SAE the page explains and where its features come from."""

    sae: LoadedSAE
    activation: str
    raglens: ShippedDetector | None
    ranked: tuple[tuple[int, float], ...]  # (feature, EBM importance), most important first


# --------------------------------------------------------------------------- SAE


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

    shipped = shipped_detectors(model)
    show_broken_artifacts(shipped, (RAGLENS,))
    raglens = next((d for d in shipped.detectors if d.name == RAGLENS), None)
    raw = raglens is not None and bool(getattr(raglens.detector, "raw", False))
    make_raglens = train_command(RAGLENS, shipped.folder)
    try:
        if raglens is not None and not raw:
            det = raglens.detector
            sae = det.sae  # type: ignore[attr-defined]
            ranked = tuple(det.importances())  # type: ignore[attr-defined]
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


# --------------------------------------------------------------------------- endpoint


def secret_settings() -> dict[str, str]:
    """The explainer settings found in Streamlit's secrets (none without secrets.toml)."""
    try:
        return {n: str(st.secrets[n]) for n in SETTING_NAMES if n in st.secrets}
    except FileNotFoundError:  # no secrets.toml anywhere: nothing configured there
        return {}


@st.cache_data(ttl=300, show_spinner=False)
def stated_context(base_url: str | None, model_name: str, _endpoint: LLMEndpoint) -> int | None:
    """The context the explainer's server states (cached per server and model a while)."""
    return probe_context(_endpoint)


def endpoint_section() -> LLMEndpoint | None:
    """The configured explainer (its context filled in when known), or how to configure one."""
    secrets = secret_settings()
    try:
        endpoint = LLMEndpoint.resolve(secrets=secrets)
    except DataError as e:
        st.error(f"The explainer settings are malformed: {md(e)}")
        return None
    if endpoint is not None:
        where = f"`{ENV_CONTEXT}`"
        if endpoint.context is None:
            stated = stated_context(endpoint.base_url, endpoint.model, endpoint)
            if stated is not None and stated >= MIN_CONTEXT:
                endpoint = replace(endpoint, context=stated)
                where = "its server's model list"
        context = (
            f"context {endpoint.context:,} tokens (from {where}): prompts are fitted to it"
            if endpoint.context is not None
            else f"context not stated: prompts go whole (set `{ENV_CONTEXT}` for a small model)"
        )
        st.caption(f"Explainer: {code(endpoint.model)} at {md(endpoint.where)} · {context}.")
        return endpoint
    missing = " and ".join(f"`{m}`" for m in LLMEndpoint.missing(secrets=secrets))
    st.info(
        "**No LLM endpoint is configured**, so no new explanations can be written; cached "
        f"ones are still shown. {CONFIG_HELP} Missing: {missing}. Then reload this page.",
        icon=":material/key:",
    )
    st.code(SECRETS_EXAMPLE, language="toml")
    return None


def prompt_budget(model: LoadedModel, endpoint: LLMEndpoint | None) -> PromptBudget | None:
    """What the explainer's prompts may take, counted with the loaded model's tokenizer."""
    if endpoint is None or endpoint.context is None:
        return None
    tok = model.tokenizer

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return PromptBudget(context=endpoint.context, count=count)


def layout_text(prompt: ExplainPrompt, fx: FeatureExamples) -> str:
    """How much of the examples a prompt shows, in words."""
    window = "whole answers" if prompt.window is None else f"at most {prompt.window} tokens each"
    size = f", about {prompt.n_tokens:,} tokens" if prompt.n_tokens is not None else ""
    return (
        f"{prompt.n_shown} of the {len(fx.shown)} answers ({prompt.n_top} strongest, "
        f"{prompt.n_spread} spread), {window}{size}"
    )


# --------------------------------------------------------------------------- answers


def read_row(
    state: AppState, model: LoadedModel, choice: SaeChoice, picked: PickedExamples
) -> None:
    """What the picked answers are, beside the button that reads their SAE activations."""
    chosen = picked.chosen
    selection = state.explain.selection
    c_note, c_button = st.columns([4, 1], vertical_alignment="center")
    with c_note:
        st.caption(
            f"{len(chosen)} of the {len(picked.pool)} examples ({split_label(selection.split)}) "
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
        return
    timed = paced_read(model, choice.sae, chosen, choice.activation)
    with progress_bar("SAE activations:") as progress:
        try:
            with timed:
                got = encode_answers(
                    model,
                    choice.sae,
                    chosen,
                    activation=choice.activation,  # type: ignore[arg-type]
                    progress=progress,
                    on_error="skip",
                )
        except RagscopeError as e:
            st.error(f"The activations could not be read: {md(e)}")
            return
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
            f"Showing {len(req.ids)} answers of {md(req.dataset_label)} "
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


# --------------------------------------------------------------------------- explain


def request_stop(state: AppState) -> None:
    state.explain.stop = True


def batch_row(
    state: AppState,
    model: LoadedModel,
    endpoint: LLMEndpoint | None,
    items: list[FeatureExamples],
    budget: PromptBudget | None,
) -> None:
    """The "Explain top N" row, with progress and a Stop button; the outcome shows once."""
    if state.explain.stop:
        state.explain.stop = False
        state.explain.outcome = (
            "info",
            "Stopped. The explanations written before the stop are cached; press "
            "**Explain top N** again to go on.",
        )
    n_max = max(len(items), 1)
    if not 1 <= state.explain.top_n <= n_max:
        state.explain.top_n = min(5, n_max)
        st.session_state.pop(KEY_EXPLAIN_TOP_N, None)
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
        stop_slot = st.empty()
        stop_slot.button(
            "Stop",
            key=KEY_EXPLAIN_STOP,
            icon=":material/stop:",
            on_click=request_stop,
            args=(state,),
        )
        bar = st.progress(0.0, text="Explaining…")
        result = explain_many(
            endpoint,
            model.info.key,
            items[: state.explain.top_n],
            store=get_store(),
            progress=lambda d, t: bar.progress(d / max(t, 1), text=f"Explained {d} / {t}"),
            should_stop=lambda: state.explain.stop,
            budget=budget,
        )
        bar.empty()
        stop_slot.empty()
        parts = [f"{len(result.done)} of {result.total} features explained"]
        if result.done:
            parts.append(
                f"{result.n_requested} asked, {len(result.done) - result.n_requested} cached"
            )
        if result.skipped:
            parts.append(f"{len(result.skipped)} fire on none of these answers")
        text = " · ".join(parts) + "."
        if result.error:
            state.explain.outcome = ("error", f"{text} Stopped on an error: {result.error}")
        elif result.cancelled:
            state.explain.outcome = ("info", f"{text} Stopped on request.")
        else:
            state.explain.outcome = ("success", text)
    if state.explain.outcome is not None:
        kind, text = state.explain.outcome
        {"error": st.error, "info": st.info, "success": st.success}[kind](text)
        state.explain.outcome = None


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
    rank = {f: i + 1 for i, (f, _) in enumerate(choice.ranked)}
    with st.container(border=True):
        facts = [f"fires on {fx.n_firing} of {fx.n_examples} answers"]
        if k in rank:
            facts.insert(0, f"raglens #{rank[k]}")
        if fx.n_firing:
            facts.append(f"peak {float(fx.max_activations.max()):.3f}")
        st.markdown(f"#### F{k}")
        st.caption(" · ".join(facts))
        if not fx.n_firing:
            st.caption(f"F{k} fires on none of these answers: nothing to show or explain.")
            return
        store = get_store()
        expl = cached_explanation(model.info.key, fx, store=store)
        prompt: ExplainPrompt | None = None
        if endpoint is not None:
            try:
                prompt = build_prompt(fx, budget=budget)
            except DataError as e:
                st.error(f"F{k} cannot be explained by this explainer: {md(e)}")
        # A cached explanation from a smaller prompt can be rewritten from this larger one.
        more = (
            expl is not None
            and prompt is not None
            and expl.prompt is not None
            and prompt.hash != expl.prompt_hash
            and (prompt.n_shown, prompt.window or 10**9)
            > (expl.prompt.n_shown, expl.prompt.window or 10**9)
        )
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
            if expl is None:
                st.warning("Explain the feature first; the fidelity check reads its explanation.")
            else:
                try:
                    with st.spinner(f"Asking {md(endpoint.model)} to predict F{k}…"):
                        state.explain.fidelity[expl.prompt_hash] = fidelity(
                            endpoint, expl, fx.held_out, budget=budget
                        )
                except (LLMError, DataError) as e:
                    st.error(f"The fidelity check of F{k} failed: {md(e)}")
        fid = state.explain.fidelity.get(expl.prompt_hash) if expl is not None else None
        if fid is not None:
            r = (
                "undefined (constant predictions or activations)"
                if fid.r != fid.r
                else f"{fid.r:+.2f}"
            )
            unread = f"; {fid.n_unread} answer(s) got no prediction" if fid.n_unread else ""
            st.markdown(
                f"**Fidelity:** Pearson r = {r} over {fid.n_tokens} tokens of "
                f"{len(fid.example_ids)} held-out answers{unread}."
            )
        top = max(e.max_activation for e in fx.shown)
        show_examples("Top-activating answers", fx.top, k, top)
        show_examples("Quantile sample", fx.quantile, k, top)


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
    read_row(state, model, choice, picked)
    req = current_request(state, model, choice, picked)
    if req is None:
        return
    try:
        pool = (
            picked.examples
            if req.dataset_key == picked.key
            else heads_examples(req.source, state.dataset)[2]
        )
    except RagscopeError as e:
        st.error(f"{md(req.dataset_label)} cannot be read: {md(e)}")
        return
    by_id = {e.id: e for e in pool}
    examples = [by_id[i] for i in req.ids if i in by_id]
    if not features and not choice.ranked:
        features = most_active(model, choice, examples)
    if not features:
        st.info("No feature to show: pick some above.")
        return
    try:
        items = [sae_feature_examples(model, choice.sae, req, pool, k) for k in features]
    except RagscopeError as e:
        st.error(f"The features' examples could not be read: {md(e)}")
        return
    budget = prompt_budget(model, endpoint)
    batch_row(state, model, endpoint, items, budget)
    for fx in items:
        feature_card(state, model, endpoint, choice, fx, budget)


main()
