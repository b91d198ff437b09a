"""The explainer of the Feature explanations page: the OpenAI-compatible chat endpoint
configured by environment variables or ``.streamlit/secrets.toml``
(:data:`core.base.llm.SETTING_NAMES`), its context, and what its prompts may take."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app.text import code, md
from core.base.errors import DataError
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
from core.base.words import plural
from core.engine.model import LoadedModel
from core.explain import ExplainPrompt, FeatureExamples, PromptBudget

SECRETS_EXAMPLE = f"""# .streamlit/secrets.toml (or export the same names as environment variables)
{ENV_BASE_URL} = "http://localhost:11434/v1"   # any OpenAI-compatible server
{ENV_MODEL} = "qwen2.5:7b-instruct"
{ENV_API_KEY} = "..."                           # if the server needs one
{ENV_CONTEXT} = 32768                          # its context in tokens, if the server does not list it
"""


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
        f"{prompt.n_shown} of the {len(fx.shown)} {plural(len(fx.shown), 'answer')} "
        f"({prompt.n_top} strongest, "
        f"{prompt.n_spread} spread), {window}{size}"
    )
