"""Agreement: where the shipped detectors agree, with each other and with gold.

For the answers of a dataset (the Home dataset or the built-in corpus), every chosen
detector's verdict (one trace per answer; features from the cache): the pairwise
correlation of their scores, a matrix of where each call matches gold, the share of
answers each pair gets right together or apart, and the answers they disagree on
most, each one click away from the Token heatmaps page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import streamlit as st

from app.components.agreement_charts import correlation_figure, gold_matrix_figure
from app.components.answer_picker import open_in_token_heatmaps
from app.components.charts import greyed
from app.components.estimate import estimate_caption, progress_bar
from app.components.example_picker import dataset_labels, pick_page_dataset
from app.components.exports import plot, whole_table
from app.state.agreement import (
    KEY_DATASET,
    KEY_DETECTORS,
    KEY_LIMIT,
    KEY_LIST,
    KEY_METHOD,
    KEY_OPEN,
    KEY_RUN,
)
from app.state.datasets import get_store
from app.state.detectors import detector_set
from app.state.estimates import paced_extraction, work_estimate
from app.state.heads import heads_examples
from app.state.links import (
    P_DETECTORS,
    P_LIMIT,
    P_METHOD,
    Followed,
    bind,
    follow_list,
    follow_widget,
    integer,
    one_of,
    publish,
)
from app.state.model import get_model
from app.state.session import AppState, app_state, seed_widget
from app.text import md
from core.analysis.detector_agreement import (
    VerdictTable,
    agreement_evidence,
    disagreements,
    pairwise_gold,
    score_correlation,
    verdict_table,
)
from core.base.errors import RagscopeError
from core.base.words import plural
from core.pipeline.extract import FeatureCache
from core.review import dataset_verdicts

if TYPE_CHECKING:
    import pandas as pd
    from streamlit.delta_generator import DeltaGenerator

STATE_KEY = "ragscope.agreement"
DEFAULT_LIMIT = 24
MAX_DISAGREEMENTS = 50  # rows of "disagree on most" (the caption says when there are more)
ACTION = "agreement"  # what Compare's paces are recorded as (app.state.estimates)
METHODS = ["spearman", "pearson", "kendall"]
GOLD_WORDS = {1: "hallucinated", 0: "faithful"}


@dataclass
class AgreementState:
    tables: dict[str, VerdictTable] = field(default_factory=dict)  # by request key
    last: str | None = None


def page_state() -> AgreementState:
    if STATE_KEY not in st.session_state:
        st.session_state[STATE_KEY] = AgreementState()
    return st.session_state[STATE_KEY]


def choose_limit(column: DeltaGenerator, n_examples: int) -> int:
    """The number of answers to compare, from 2 to ``n_examples`` (linked to the URL)."""
    default_limit = min(DEFAULT_LIMIT, n_examples)
    if not 2 <= st.session_state.get(KEY_LIMIT, default_limit) <= n_examples:
        st.session_state.pop(KEY_LIMIT)  # remembered for a larger dataset
    return bind(
        P_LIMIT,
        KEY_LIMIT,
        lambda: int(
            column.number_input("Answers", min_value=2, max_value=n_examples, key=KEY_LIMIT)
        ),
        parse=integer(2, n_examples),
        seed=default_limit,
        default=str(default_limit),
        what="number of answers",
        where=f"a number from 2 to {n_examples}",
    )


def choose_detectors(names: list[str]) -> list[str]:
    """The detectors to compare, among ``names`` (linked to the URL)."""
    det_link = follow_list(P_DETECTORS, one_of(names))
    if det_link.value is not None:
        st.session_state[KEY_DETECTORS] = det_link.value
    if any(n not in names for n in st.session_state.get(KEY_DETECTORS, ())):
        st.session_state.pop(KEY_DETECTORS)  # another model's detectors
    seed_widget(KEY_DETECTORS, names)
    chosen = st.multiselect("Detectors", names, key=KEY_DETECTORS)
    publish(
        P_DETECTORS,
        ",".join(chosen),
        default=",".join(names),
        missing=det_link.missing,
        what="detectors",
        where="among this model's trained detectors (" + ", ".join(names) + ")",
        instead=md(", ".join(chosen) or "none"),
    )
    return chosen


def show_agreement(table: VerdictTable, method_link: Followed[str]) -> None:
    """The score correlation map, the right-and-wrong-together table and the gold matrix."""
    method = st.radio("Correlation", METHODS, horizontal=True, key=KEY_METHOD)
    publish(
        P_METHOD,
        method,
        default=METHODS[0],
        missing=method_link.missing,
        what="correlation",
        where=" or ".join(METHODS),
    )
    corr = score_correlation(table, method)
    few_corr, few_gold = agreement_evidence(table)
    if few_corr:
        st.warning(f"{md(few_corr)} Raise **Answers** to read them; the map is greyed.")
    c_corr, c_pairs = st.columns([1, 1])
    with c_corr:
        fig = correlation_figure(corr, title=f"Score correlation ({method})")
        plot(greyed(fig) if few_corr else fig, key="agreement.correlation")
    with c_pairs:
        st.markdown("**Right and wrong together** (labelled answers)")
        if few_gold:
            st.caption(f":grey[{md(few_gold)}]")
        # A static table: every pair in view (no inner scroll), headers wrapped in the
        # half-width column.
        st.table(
            pairwise_gold(table).style.format(
                {
                    "both right": "{:.0%}",
                    "only A": "{:.0%}",
                    "only B": "{:.0%}",
                    "neither": "{:.0%}",
                }
            ),
            hide_index=True,
        )
    if (table.gold >= 0).any():
        fig = gold_matrix_figure(table, title="Where each detector's call matches gold")
        plot(greyed(fig) if few_gold else fig, key="agreement.gold")


def with_probabilities(shown: pd.DataFrame, table: VerdictTable) -> pd.DataFrame:
    """``shown`` (rows of :func:`~core.analysis.detector_agreement.disagreements`) with
    each detector's column as its probability beside its flag (``0.873 ⚑`` when it
    flags the answer) and gold in words."""
    at = {e: i for i, e in enumerate(table.example_ids)}
    rows = [at[str(e)] for e in shown["example"]]
    out = shown.copy()
    out["gold"] = [GOLD_WORDS.get(int(g), "-") for g in shown["gold"]]
    for k, d in enumerate(table.detectors):
        out[d] = [f"{table.scores[i, k]:.3f}{' ⚑' if table.calls[i, k] == 1 else ''}" for i in rows]
    return out


def show_disagreements(state: AppState, choice: str, table: VerdictTable) -> None:
    """The answers the detectors disagree on most, each one click from Token heatmaps."""
    st.markdown("**Answers the detectors disagree on most**")
    dis = disagreements(table)
    shown = dis.head(MAX_DISAGREEMENTS)
    event = whole_table(  # every detector and answer, no inner scroll
        with_probabilities(shown, table),
        numbers=("split", "score spread"),
        column_config={
            "flagged by": st.column_config.ProgressColumn(format="percent", min_value=0.0),
            # each column as wide as its detector's name: none cut off
            **{d: st.column_config.TextColumn(help=f"{d}'s probability") for d in table.detectors},
        },
        on_select="rerun",
        selection_mode="single-row",
        key=KEY_LIST,
    )
    rows_note = (
        f"The {len(shown)} most split of the {len(dis)} answers. " if len(dis) > len(shown) else ""
    )
    st.caption(
        f"{rows_note}Each detector's column: its probability for the answer, ⚑ where it "
        "flags it. Gold: the answer's label (- = unlabelled). Pick a row to open that answer "
        "with the button below."
    )
    rows = event.selection.rows if event is not None else []
    target = str(shown.iloc[rows[0]]["example"]) if rows else str(shown.iloc[0]["example"])
    if st.button(
        f"Open {md(target)} in Token heatmaps", key=KEY_OPEN, icon=":material/open_in_new:"
    ):
        open_in_token_heatmaps(state, choice, target)


def main() -> None:
    st.title("Agreement between detectors")
    st.caption(
        "Do the detectors see the same hallucinations? Their scores' correlation, where "
        "each one's call matches gold, and the answers they disagree on most."
    )
    state = app_state()
    ag = page_state()
    model = get_model()
    shipped = detector_set(model)
    names = [s.name for s in shipped.detectors]
    if len(names) < 2:
        st.info(
            "Agreement needs at least two trained detectors for this model; train them "
            "with `ragscope train --detectors ...`."
        )
        return
    c_ds, c_lim = st.columns([3, 1], vertical_alignment="bottom")
    choice = pick_page_dataset(state, KEY_DATASET, c_ds)
    labels = dataset_labels(state.dataset)
    try:
        key, label, examples = heads_examples(choice, state.dataset)
    except RagscopeError as e:
        st.error(f"{md(labels[choice])} cannot be read: {md(e)}")
        return
    if not examples:
        st.info("This dataset holds no examples; pick another one.")
        return
    limit = choose_limit(c_lim, len(examples))
    chosen = choose_detectors(names)
    request = f"{key}|{limit}|{','.join(chosen)}|{shipped.cache_id}"
    method_link = follow_widget(P_METHOD, KEY_METHOD, one_of(METHODS))
    slot = st.empty()
    run = st.button(
        "Compare", key=KEY_RUN, type="primary", icon=":material/compare_arrows:",
        disabled=len(chosen) < 2,
    )  # fmt: skip
    if len(chosen) >= 2 and not run:
        estimate_caption(
            lambda: work_estimate(
                model, examples[:limit], shipped.subset(chosen).fitted, action=ACTION
            ),
            where=slot,
        )
    if run:
        subset = shipped.subset(chosen)
        timed = paced_extraction(model, examples[:limit], subset.fitted, action=ACTION)
        with progress_bar("Reading verdicts:") as progress:
            try:
                with timed as pacer:
                    kept, verdicts = dataset_verdicts(
                        model,
                        examples[:limit],
                        subset,
                        cache=FeatureCache(get_store()),
                        progress=pacer.ticking(progress),
                    )
            except RagscopeError as e:
                st.error(f"The detectors could not read {md(label)}: {md(e)}")
                return
        ag.tables[request] = verdict_table(kept, verdicts, chosen)
    table = ag.tables.get(request)
    if table is None:
        n = len(chosen)
        whose = f"{n} detector's" if n == 1 else f"{n} detectors'"
        st.info(f"Press **Compare** to read {whose} verdicts on {limit} answers.")
        return
    if table.scores.shape[0] < 2:
        st.warning("Fewer than two answers could be read; nothing to compare.")
        return
    st.caption(
        f"{len(table.example_ids)} {plural(len(table.example_ids), 'answer')} of {md(label)}."
    )
    if table.left_out:
        why = "; ".join(f"**{md(d)}**: {md(w)}" for d, w in table.left_out.items())
        st.info(
            f"Left out: {why}. A calibration without signal gives every answer the same "
            "probability and makes no call, so it has no correlation and no call to compare "
            "with gold."
        )
    if len(table.detectors) < 2:
        st.warning("Fewer than two detectors carry a signal here; nothing to compare.")
        return
    show_agreement(table, method_link)
    show_disagreements(state, choice, table)


main()
