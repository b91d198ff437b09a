"""Several token heatmaps of one answer, aligned on the same tokens.

:func:`multirow_html` is pure (tokens and rows in, an HTML string out). The answer
is laid out in lines of about ``line_chars`` characters; each line is a table whose
first row holds the token texts and whose next rows hold one coloured cell per token
for each :class:`HeatRow` (gold spans, a detector's raw and smoothed scores, ...), so
every row's cell sits under its token, on every line, with the row's name at its left.
Hovering any cell of a token shows every row's value for that token.

Tokens the threshold flags are boxed in red; a focused span (the one "Previous" /
"Next" jumped to) is highlighted in yellow.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.components.heatmap import (
    GOLD_COLOR,
    NAN_COLOR,
    SURPRISAL_CMAP,
    ColorStops,
    interpolate_color,
    visible_token,
)

SCORE_CMAP: ColorStops = SURPRISAL_CMAP
GOLD_CMAP: ColorStops = ((0.0, "#f4f5f8"), (1.0, GOLD_COLOR))
ACTIVATION_CMAP: ColorStops = ((0.0, "#ffffff"), (0.5, "#c7b8ea"), (1.0, "#5e3c99"))
DIFF_CMAP: ColorStops = ((0.0, "#2166ac"), (0.5, "#f7f7f7"), (1.0, "#b2182b"))
"""A difference: blue (lower) through white (unchanged) to red (higher); use vmin=-1, vmax=1."""

_CSS = """
<style>
.rs-mr { font-family: "Source Sans Pro", "Source Sans 3", system-ui, sans-serif;
  border: 1px solid #d9dbe1; border-radius: 0.5rem; padding: 0.5rem 0.6rem; background: #fff; }
.rs-mr table { border-collapse: separate; border-spacing: 1px 2px; margin: 0 0 0.7rem 0; }
.rs-mr td { padding: 0; vertical-align: middle; }
.rs-mr td.rs-mr-name { font-size: 0.72rem; color: #50535e; padding-right: 0.5rem;
  white-space: nowrap; text-align: right; min-width: 10rem; max-width: 10rem;
  overflow: hidden; text-overflow: ellipsis; }
.rs-mr td.rs-mr-tok { font-size: 1.0rem; color: #111; white-space: pre; padding: 1px 1px;
  border: 2px solid transparent; border-radius: 3px; }
.rs-mr td.rs-mr-tok.rs-mr-flag { border-color: #d7301f; }
.rs-mr td.rs-mr-tok.rs-mr-focus { background: #ffe66d; }
.rs-mr td.rs-mr-cell { height: 0.8rem; min-width: 0.5rem; border-radius: 2px; }
.rs-mr td:hover { outline: 1px solid #333; }
.rs-mr-legend { display: flex; gap: 1rem; flex-wrap: wrap; font-size: 0.8rem; color: #31333f; }
.rs-mr-legend span.rs-mr-box { border: 2px solid #d7301f; border-radius: 3px; padding: 0 0.2rem; }
.rs-mr-legend span.rs-mr-hl { background: #ffe66d; padding: 0 0.2rem; }
.rs-mr-ws { color: #8a8a8a; }
</style>
"""


@dataclass(frozen=True, kw_only=True, eq=False)
class HeatRow:
    """One row of cells: a value per token and how to colour it.

    Attributes:
        name: Row label (left of every line, and in the hover).
        values: ``[T]`` one value per token (NaN: no value, grey).
        vmin: Value of the first colour.
        vmax: Value of the last colour.
        cmap: Colour stops.
        fmt: How the hover prints a value (a format spec, e.g. ``.3f``).
        shown: Text the hover prints per token instead of the formatted value (e.g. the
            raw activation behind a normalised colour).
    """

    name: str
    values: np.ndarray
    vmin: float = 0.0
    vmax: float = 1.0
    cmap: ColorStops = SCORE_CMAP
    fmt: str = ".3f"
    shown: Sequence[str] | None = None

    def text(self, j: int) -> str:
        if self.shown is not None:
            return self.shown[j]
        v = float(self.values[j])
        return "n/a" if math.isnan(v) else format(v, self.fmt)

    def color(self, j: int) -> str:
        v = float(self.values[j])
        if math.isnan(v):
            return NAN_COLOR
        span = self.vmax - self.vmin if self.vmax > self.vmin else 1.0
        return interpolate_color((v - self.vmin) / span, self.cmap)


def gold_row(labels: Sequence[int] | np.ndarray, name: str = "gold span") -> HeatRow:
    """The gold labels as a row (blue inside a hallucinated span)."""
    lab = np.asarray(labels, dtype=np.float64)
    return HeatRow(
        name=name,
        values=lab,
        cmap=GOLD_CMAP,
        shown=["hallucinated" if v >= 0.5 else "faithful" for v in lab],
    )


def _lines(tokens: Sequence[str], line_chars: int) -> list[list[int]]:
    """Token indices per line: a new line after about ``line_chars`` characters or a newline."""
    out: list[list[int]] = [[]]
    width = 0
    for j, tok in enumerate(tokens):
        n = max(len(tok), 1)
        if out[-1] and width + n > line_chars:
            out.append([])
            width = 0
        out[-1].append(j)
        width += n
        if "\n" in tok:
            out.append([])
            width = 0
    return [line for line in out if line]


def multirow_html(
    tokens: Sequence[str],
    rows: Sequence[HeatRow],
    *,
    flagged: Sequence[bool] | np.ndarray | None = None,
    focus: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
    line_chars: int = 72,
) -> str:
    """HTML of the answer's tokens with one aligned row of cells per :class:`HeatRow`.

    Args:
        tokens: Token texts ``[T]``.
        rows: The rows, top to bottom; each holds ``T`` values.
        flagged: ``[T]`` tokens to box (a predicted span), or ``None``.
        focus: ``(first, last)`` token indices (inclusive) to highlight, or ``None``.
        positions: Absolute positions for the hover (default 0..T-1).
        line_chars: About how many characters one line holds.

    Raises:
        ValueError: A row, ``flagged`` or ``positions`` does not have one entry per token.
    """
    n = len(tokens)
    for r in rows:
        if np.asarray(r.values).reshape(-1).shape[0] != n:
            raise ValueError(f"row {r.name!r} has {len(r.values)} values for {n} tokens")
        if r.shown is not None and len(r.shown) != n:
            raise ValueError(f"row {r.name!r} shows {len(r.shown)} texts for {n} tokens")
    if flagged is not None and len(flagged) != n:
        raise ValueError(f"flagged has {len(flagged)} entries for {n} tokens")
    if positions is not None and len(positions) != n:
        raise ValueError(f"got {len(positions)} positions for {n} tokens")
    pos = list(positions) if positions is not None else list(range(n))
    flag = np.zeros(n, dtype=bool) if flagged is None else np.asarray(flagged, dtype=bool)
    titles = []
    for j, tok in enumerate(tokens):
        lines = [f"token {j}: {tok!r}", f"position: {pos[j]}"]
        lines += [f"{r.name}: {r.text(j)}" for r in rows]
        if flagged is not None:
            lines.append(f"flagged: {'yes' if flag[j] else 'no'}")
        titles.append(html.escape("\n".join(lines), quote=True).replace("\n", "&#10;"))
    parts = [_CSS, '<div class="rs-mr">']
    for line in _lines(tokens, line_chars):
        parts.append("<table><tr><td class='rs-mr-name'></td>")
        for j in line:
            cls = "rs-mr-tok"
            if flag[j]:
                cls += " rs-mr-flag"
            if focus is not None and focus[0] <= j <= focus[1]:
                cls += " rs-mr-focus"
            text = visible_token(tokens[j]).replace("rs-ws", "rs-mr-ws").replace("<br>", "")
            parts.append(f'<td class="{cls}" data-tok="{j}" title="{titles[j]}">{text}</td>')
        parts.append("</tr>")
        for r in rows:
            parts.append(f'<tr><td class="rs-mr-name">{html.escape(r.name)}</td>')
            for j in line:
                parts.append(
                    f'<td class="rs-mr-cell" style="background-color: {r.color(j)};" '
                    f'title="{titles[j]}"></td>'
                )
            parts.append("</tr>")
        parts.append("</table>")
    legend = ['<div class="rs-mr-legend">']
    if flagged is not None:
        legend.append(
            '<span><span class="rs-mr-box">boxed</span> = flagged by the threshold</span>'
        )
    if focus is not None:
        legend.append('<span><span class="rs-mr-hl">highlighted</span> = the current span</span>')
    legend.append("<span>hover any cell for every row's value of that token</span></div>")
    parts += legend
    parts.append("</div>")
    return "".join(parts)
