"""Exports: every plotly figure as PNG and SVG files, every table as CSV.

:func:`plot` is the one way a page shows a figure. Plotly's modebar camera saves a PNG
in the browser; under the figure, **SVG** and **PNG** buttons download the figure as
rendered on the server by Kaleido (a headless Chromium: vector SVG for papers, a 2x
PNG for slides), produced only when clicked, without rerunning the page. Without a
Chromium on the server the two buttons are disabled and say what to install. Tables
are ``st.dataframe``s, whose toolbar downloads CSV (:func:`whole_table` shows one
whole, its numbers at three decimals); a static ``st.table`` (kept where long texts
must wrap) gets :func:`csv_button`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import plotly.io as pio
import streamlit as st

from core.review.export import safe_csv

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go
    from streamlit.delta_generator import DeltaGenerator

Format = Literal["svg", "png"]
MIME: dict[Format, str] = {"svg": "image/svg+xml", "png": "image/png"}
PNG_SCALE = 2
"""Pixels per CSS pixel of a downloaded PNG (sharp on slides and retina screens)."""
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
NO_BROWSER = (
    "Exporting figures on the server needs a Chromium: install it (Debian/Ubuntu: "
    "`apt-get install chromium`) or point BROWSER_PATH at one. The camera in the "
    "figure's toolbar still saves a PNG from your browser."
)


def export_browser() -> str | None:
    """The Chromium Kaleido will use (``BROWSER_PATH``, else one on ``PATH``), or ``None``."""
    env = os.environ.get("BROWSER_PATH")
    if env and os.access(env, os.X_OK):
        return env
    return next((p for b in _BROWSERS if (p := shutil.which(b))), None)


def file_stem(key: str) -> str:
    """A safe file name from a figure's widget key (``benchmark.cv.roc`` stays as is)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("._") or "figure"


def figure_bytes(fig: go.Figure, fmt: Format) -> bytes:
    """``fig`` rendered as an SVG or a PNG (at :data:`PNG_SCALE`) by Kaleido.

    Raises:
        RuntimeError: No Chromium to render with (the message says what to install).
    """
    if export_browser() is None:
        raise RuntimeError(NO_BROWSER)
    scale = PNG_SCALE if fmt == "png" else 1
    return pio.to_image(fig, format=fmt, scale=scale)


def _deferred(fig: go.Figure, fmt: Format) -> Callable[[], bytes]:
    return lambda: figure_bytes(fig, fmt)


def plot(
    fig: go.Figure,
    *,
    key: str,
    where: DeltaGenerator | None = None,
    exports: bool = True,
    **kwargs: Any,
) -> None:
    """Show ``fig`` full width (``where``: a column or container; default the page),
    with the modebar's PNG named after ``key`` and, unless ``exports`` is false, SVG and
    PNG download buttons rendered on the server when clicked."""
    box = where if where is not None else st
    stem = file_stem(key)
    config = {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": stem, "scale": PNG_SCALE},
    }
    box.plotly_chart(fig, key=key, config=config, **{"width": "stretch", **kwargs})
    if not exports:
        return
    ready = export_browser() is not None
    tip = "rendered on the server; nothing reruns" if ready else NO_BROWSER
    row = box.container(horizontal=True, gap="small")
    for fmt in ("svg", "png"):
        row.download_button(
            fmt.upper(),
            data=_deferred(fig, fmt),
            file_name=f"{stem}.{fmt}",
            mime=MIME[fmt],
            key=f"{key}.export.{fmt}",
            on_click="ignore",
            type="tertiary",
            icon=":material/download:",
            disabled=not ready,
            help=f"Download this figure as {fmt.upper()} ({tip})",
        )


def csv_button(frame: pd.DataFrame, *, key: str, where: DeltaGenerator | None = None) -> None:
    """A CSV download of ``frame`` (its index included, formula-like text cells
    neutralised: :func:`core.review.export.safe_csv`), made only when clicked."""
    box = where if where is not None else st
    box.download_button(
        "CSV",
        data=lambda: safe_csv(frame, index=True).encode("utf-8"),
        file_name=f"{file_stem(key)}.csv",
        mime="text/csv",
        key=f"{key}.export.csv",
        on_click="ignore",
        type="tertiary",
        icon=":material/download:",
        help="Download this table as CSV",
    )


PROBABILITY_FORMAT = "%.3f"
"""How every page prints a probability, a score or a threshold in a table (three
decimals, as in the text of every page)."""


def whole_table(
    frame: pd.DataFrame,
    *,
    numbers: Sequence[str] = (),
    column_config: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``frame`` as an ``st.dataframe`` shown whole: every row, no inner scrollbar
    (``height="content"``), its ``numbers`` columns (probabilities, scores, thresholds)
    at :data:`PROBABILITY_FORMAT`. ``kwargs`` go to ``st.dataframe`` (a selection, a
    key); returns what it returns."""
    config: dict[str, Any] = {
        c: st.column_config.NumberColumn(format=PROBABILITY_FORMAT)
        for c in numbers
        if c in frame.columns
    }
    config.update(column_config or {})
    return st.dataframe(
        frame,
        hide_index=kwargs.pop("hide_index", True),
        width="stretch",
        height="content",
        column_config=config,
        **kwargs,
    )
