"""Saved runs in the Benchmark's pickers: how a run is named and dated, the multiselect
of saved runs bound to the URL, and the CSV downloads its sections offer."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TypeVar

import pandas as pd
import streamlit as st

from app.state.links import (
    follow_list,
    one_of,
    publish,
)
from app.state.runs import Dated, SavedRuns, newest
from app.state.session import seed_widget
from app.text import code, md
from core.pipeline.sets import DetectorSet
from core.review.export import safe_csv

R = TypeVar("R", bound=Dated)  # a saved run of one kind (EvalRun, CVRun)


def table_height(n_rows: int) -> int:
    """Pixels that show a dataframe's header and ``n_rows`` rows without a scrollbar."""
    return 35 * (n_rows + 1) + 3


def date_label(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso


def model_name(key: str) -> str:
    return key.split("|", 1)[0]


def where_saved(saved: SavedRuns, names: Sequence[str]) -> str:
    """``"2 in `folder`, 1 shipped with ragscope"`` for the runs ``names`` (Markdown)."""
    n_shipped = sum(1 for n in names if n in saved.shipped)
    out = f"{len(names) - n_shipped} in {code(saved.folder)}"
    return out + (f", {n_shipped} shipped with ragscope" if n_shipped else "")


def keep_options(key: str, options: Sequence[str]) -> None:
    """Drop a multiselect's remembered values that are no longer options (a run was
    deleted, another run picked) before the widget is drawn."""
    widget = st.session_state.get(key)
    if widget is not None and any(v not in options for v in widget):
        st.session_state[key] = [v for v in widget if v in options]


def keep_option(key: str, options: Sequence[str]) -> None:
    """Forget a selectbox's remembered value when it is no longer an option."""
    if key in st.session_state and st.session_state[key] not in options:
        st.session_state.pop(key)


def file_stem(name: str) -> str:
    """A run name as a safe download file name stem."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


def download_csv(label: str, frame: pd.DataFrame, file_name: str, key: str) -> None:
    """A CSV download of ``frame`` (formula-like text cells neutralised), written when
    the button is pressed (a run's per-answer scores can be large)."""
    st.download_button(
        label,
        partial(safe_csv, frame),
        file_name=file_name,
        mime="text/csv",
        key=key,
        icon=":material/download:",
        disabled=frame.empty,
    )


def set_cv_run(dset: DetectorSet) -> str | None:
    """The cross-validation run the loaded set's card reads (its answer judge's, else the
    first member's that records one): what the Benchmark's tabs open on."""
    judge = dset.judge_name
    cards = [dset.card(judge)] if judge is not None else list(dset.detectors)
    return next((c.cv_run for c in cards if c.cv_run is not None), None)


def pick_saved(
    saved: SavedRuns,
    runs: Mapping[str, R],
    chosen: list[str] | None,
    key: str,
    what: str,
    label: Callable[[R], str],
    param: str,
    *,
    first: str | None = None,
) -> list[str]:
    """A multiselect of saved ``runs`` (yours first, each part newest first), the names in
    the URL's ``param``; returns the picked names. Until one is picked: ``first`` when it
    is saved (the loaded set's run), else the newest run (:func:`newest`, whichever part
    it is in); names no longer saved are dropped."""
    names = list(runs)
    link = follow_list(param, one_of(names))
    if link.value is not None:
        chosen = link.value
        st.session_state[key] = chosen
    if chosen is None:
        start = first if first in runs else newest(runs)
        chosen = [start] if start is not None else []
    chosen = [n for n in chosen if n in runs]
    keep_options(key, names)
    seed_widget(key, chosen)
    picked = st.multiselect(
        f"{what} ({where_saved(saved, names)}; yours first, each newest first; pick several to compare)",
        names,
        key=key,
        format_func=lambda n: label(runs[n]) + (" · shipped" if n in saved.shipped else ""),
    )
    publish(
        param,
        ",".join(picked),
        missing=link.missing,
        what="saved run",
        where=f"among the {what.lower()} saved here",
        instead=md(", ".join(picked) or "none"),
    )
    return list(picked)
