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
from app.state.datasets import load_examples
from app.state.detectors import detector_set, set_in_use
from app.state.links import on_page
from app.state.model import loaded_model, start_model
from app.state.session import app_state
from app.state.verdicts import warm_detectors
from app.text import md
from core.base.errors import RagscopeError
from core.base.paths import assets_dir

PAGES_DIR = Path(__file__).parent / "views"
# The browser tab's icon: Material Symbols' "troubleshoot" (Apache-2.0) drawn to a PNG
# this server serves. A `:material/...:` page icon makes every browser fetch the tab's
# icon from fonts.gstatic.com; set here, it also keeps the pages' own Material icons
# (drawn in the sidebar with the font Streamlit serves) from becoming the tab's icon.
FAVICON = assets_dir() / "favicon.png"

st.set_page_config(page_title="ragscope", page_icon=FAVICON, layout="wide")
login_gate()  # with logins configured, nothing below runs until the visitor signs in


def _page(file: str, title: str, icon: str, *, default: bool = False) -> st.Page:
    return st.Page(PAGES_DIR / file, title=title, icon=f":material/{icon}:", default=default)


SECTIONS: dict[str, list[st.Page]] = {
    "": [_page("home.py", "Home", "home", default=True)],
    "Analyse": [
        _page("playground.py", "Playground", "science"),
        _page("token_heatmaps.py", "Token heatmaps", "gradient"),
        _page("counterfactual.py", "Counterfactual context", "edit_note"),
        _page("mitigation.py", "Mitigation", "healing"),
    ],
    "Detectors": [
        _page("heads.py", "Heads & layers", "grid_view"),
        _page("shap_summary.py", "SHAP summary", "insights"),
        _page("token_sources.py", "Token sources", "stacked_bar_chart"),
        _page("gam.py", "GAM shape functions", "show_chart"),
        _page("feature_explanations.py", "Feature explanations", "lightbulb"),
    ],
    "Evaluate": [
        _page("benchmark.py", "Benchmark", "leaderboard"),
        _page("agreement.py", "Agreement", "join_inner"),
    ],
    "Annotate": [_page("review.py", "Review", "rate_review")],
    "Learn": [_page("learn.py", "Learn", "school")],
}  # the sidebar: Home first, then the pages grouped by what a visitor came to do

navigation = st.navigation(SECTIONS, expanded=True)  # every page listed, no "view more" fold
on_page(navigation.url_path)  # a link's warnings belong to the page it opened
exposure_banner()
start_model()  # in the background: the page draws what needs no model while it loads
with st.sidebar:
    status = st.empty()  # filled after the page ran (by then a page that needs it waited)

navigation.run()

model = loaded_model()
if model is None:
    status.caption("**Model:** loading…")
else:
    info = model.info
    shipped = detector_set(model)
    warm_detectors(model, shipped)  # once, in the background: a fast first Analyse
    try:
        home = load_examples(app_state().dataset)
    except RagscopeError:  # Home says why; the sidebar names the loaded set alone
        home = []
    status.caption(
        f"**Model:** {md(info.display_name)}  \n"
        f"{info.n_layers} layers × {info.n_heads} heads · {info.device} · {info.dtype}  \n"
        + set_in_use(shipped, home)
    )
