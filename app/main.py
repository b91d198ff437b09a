"""ragscope's Streamlit entry point: ``streamlit run app/main.py``.

The model comes from env ``RAGSCOPE_MODEL`` (default ``embedded``; tests use
``tiny``). It is loaded once per server process and shared by every session.
With logins configured (``[auth]`` in ``.streamlit/secrets.toml``) every page is
behind :func:`app.auth.login_gate`; served beyond localhost without them, every page
warns (:func:`app.auth.exposure_banner`).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.auth import exposure_banner, login_gate
from app.state import get_model
from app.text import md

PAGES_DIR = Path(__file__).parent / "views"

st.set_page_config(page_title="ragscope", page_icon=":material/troubleshoot:", layout="wide")
login_gate()  # with logins configured, nothing below runs until the visitor signs in

navigation = st.navigation(
    [
        st.Page(PAGES_DIR / "home.py", title="Home", icon=":material/home:", default=True),
        st.Page(PAGES_DIR / "playground.py", title="Playground", icon=":material/science:"),
        st.Page(
            PAGES_DIR / "token_heatmaps.py", title="Token heatmaps", icon=":material/gradient:"
        ),
        st.Page(
            PAGES_DIR / "counterfactual.py",
            title="Counterfactual context",
            icon=":material/edit_note:",
        ),
        st.Page(PAGES_DIR / "mitigation.py", title="Mitigation", icon=":material/healing:"),
        st.Page(PAGES_DIR / "heads.py", title="Heads & layers", icon=":material/grid_view:"),
        st.Page(PAGES_DIR / "shap_summary.py", title="SHAP summary", icon=":material/insights:"),
        st.Page(
            PAGES_DIR / "token_sources.py",
            title="Token sources",
            icon=":material/stacked_bar_chart:",
        ),
        st.Page(PAGES_DIR / "gam.py", title="GAM shape functions", icon=":material/show_chart:"),
        st.Page(
            PAGES_DIR / "feature_explanations.py",
            title="Feature explanations",
            icon=":material/lightbulb:",
        ),
        st.Page(PAGES_DIR / "benchmark.py", title="Benchmark", icon=":material/leaderboard:"),
        st.Page(PAGES_DIR / "agreement.py", title="Agreement", icon=":material/join_inner:"),
        st.Page(PAGES_DIR / "review.py", title="Review", icon=":material/rate_review:"),
        st.Page(PAGES_DIR / "learn.py", title="Learn", icon=":material/school:"),
    ],
    expanded=True,  # every page listed, without a "view more" fold
)

exposure_banner()
model = get_model()
with st.sidebar:
    info = model.info
    st.caption(
        f"**Model:** {md(info.display_name)}  \n"
        f"{info.n_layers} layers × {info.n_heads} heads · {info.device} · {info.dtype}"
    )

navigation.run()
