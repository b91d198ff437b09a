"""Token heatmap: one coloured ``<span>`` per token, with hover details and gold underlines.

:func:`token_heatmap_html` is a pure function (tokens and values in, an HTML string
out) so it can be unit-tested; :func:`render_token_heatmap` puts it on the page.

Token text is always HTML-escaped. Whitespace is made visible: a newline shows as
``↵`` followed by a real line break, a tab as ``⇥``; spaces are kept as they are
(the container uses ``white-space: pre-wrap``), so a token's leading space shows
as coloured room before the word.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from core.signals.smoothing import token_flags

ColorStops = Sequence[tuple[float, str]]
"""A colour map: ``(fraction in [0, 1], "#rrggbb")`` stops in increasing order."""

SURPRISAL_CMAP: ColorStops = (
    (0.0, "#ffffff"),
    (0.35, "#fee8c8"),
    (0.65, "#fdae61"),
    (1.0, "#d7301f"),
)
"""White (expected token) through orange to red (surprising token)."""

GOLD_COLOR = "#1f4fd1"
"""Underline of tokens inside a gold hallucination span (blue, apart from the red scale)."""

NAN_COLOR = "#e0e0e0"

_CSS = """
<style>
.rs-heatmap-wrap { font-family: "Source Sans Pro", "Source Sans 3", system-ui, sans-serif; }
.rs-heatmap { white-space: pre-wrap; word-break: break-word; line-height: 2.0;
  font-size: 1.05rem; padding: 0.6rem 0.8rem; border: 1px solid #d9dbe1;
  border-radius: 0.5rem; background: #ffffff; color: #111111; }
.rs-tok { border-radius: 3px; padding: 1px 0; cursor: default; }
.rs-tok:hover { outline: 2px solid #333333; }
.rs-tok.rs-gold { border-bottom: 3px solid GOLD; border-radius: 3px 3px 0 0; }
.rs-ws { color: #8a8a8a; }
.rs-legend { display: flex; align-items: center; gap: 0.6rem; flex-wrap: wrap;
  margin-top: 0.5rem; font-size: 0.85rem; color: #31333f; }
.rs-legend-bar { width: 220px; height: 12px; border: 1px solid #c8c8c8; border-radius: 2px; }
.rs-legend-gold { display: inline-block; padding: 0 0.2rem; border-bottom: 3px solid GOLD; }
</style>
""".replace("GOLD", GOLD_COLOR)


def _hex_to_rgb(color: str) -> tuple[int, int, int]:
    c = color.lstrip("#")
    if len(c) != 6:
        raise ValueError(f"colour {color!r} is not #rrggbb")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def _check_cmap(cmap: ColorStops) -> list[tuple[float, tuple[int, int, int]]]:
    stops = [(float(f), _hex_to_rgb(c)) for f, c in cmap]
    if len(stops) < 2:
        raise ValueError("a colour map needs at least two stops")
    fracs = [f for f, _ in stops]
    if fracs[0] != 0.0 or fracs[-1] != 1.0 or any(b <= a for a, b in pairwise(fracs)):
        raise ValueError(f"colour map stops must rise strictly from 0 to 1, got {fracs}")
    return stops


def interpolate_color(frac: float, cmap: ColorStops = SURPRISAL_CMAP) -> str:
    """The colour at ``frac`` (clipped to [0, 1]) of a piecewise-linear colour map.

    Args:
        frac: Position on the scale; NaN gives the neutral grey.
        cmap: ``(fraction, "#rrggbb")`` stops from 0 to 1.

    Returns:
        ``"#rrggbb"``.
    """
    if math.isnan(frac):
        return NAN_COLOR
    stops = _check_cmap(cmap)
    x = min(max(frac, 0.0), 1.0)
    for (f0, c0), (f1, c1) in pairwise(stops):
        if x <= f1:
            t = (x - f0) / (f1 - f0)
            rgb = tuple(round(a + (b - a) * t) for a, b in zip(c0, c1, strict=True))
            return "#{:02x}{:02x}{:02x}".format(*rgb)
    return cmap[-1][1]


def text_color(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (WCAG relative luminance)."""

    def lin(v: int) -> float:
        s = v / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(v) for v in _hex_to_rgb(background))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    # Contrast with black is (L + 0.05) / 0.05, with white 1.05 / (L + 0.05); equal at ~0.179.
    return "#111111" if lum > 0.179 else "#ffffff"


def visible_token(token: str) -> str:
    """Escaped token text with newlines and tabs made visible."""
    if token == "":
        return '<span class="rs-ws">∅</span>'
    out = []
    for part in token.split("\n")[:-1]:
        out.append(html.escape(part).replace("\t", "⇥") + '<span class="rs-ws">↵</span><br>')
    out.append(html.escape(token.split("\n")[-1]).replace("\t", "⇥"))
    return "".join(out)


def _format_value(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.2f}"


def legend_html(
    vmin: float,
    vmax: float,
    *,
    value_name: str = "surprisal (bits)",
    cmap: ColorStops = SURPRISAL_CMAP,
    show_gold: bool = False,
) -> str:
    """A horizontal colour strip with its range, and the gold-span sample when asked."""
    stops = ", ".join(f"{c} {f * 100:.0f}%" for f, c in cmap)
    parts = [
        '<div class="rs-legend">',
        f"<span>{html.escape(value_name)}:</span>",
        f"<span>{_format_value(vmin)}</span>",
        f'<span class="rs-legend-bar" style="background: linear-gradient(to right, {stops});">'
        "</span>",
        f"<span>{_format_value(vmax)}</span>",
    ]
    if show_gold:
        parts.append(
            '<span class="rs-legend-gold">underlined</span><span>= inside a gold hallucination span</span>'
        )
    parts.append("</div>")
    return "".join(parts)


def token_heatmap_html(
    tokens: Sequence[str],
    values: Sequence[float] | np.ndarray,
    *,
    labels: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    value_name: str = "surprisal (bits)",
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: ColorStops = SURPRISAL_CMAP,
    legend: bool = True,
) -> str:
    """HTML of the tokens coloured by their values, with hover titles and a legend.

    Args:
        tokens: Token texts (as decoded one by one), shape ``[n]``.
        values: One value per token, shape ``[n]``; NaN shows grey.
        labels: Optional gold labels per token, shape ``[n]`` (1 = inside a
            hallucinated span: underlined; 0 = faithful).
        positions: Optional absolute positions shown in the hover (default 0..n-1).
        value_name: What the values are (legend and hover).
        vmin: Value mapped to the first colour (default: min(0, smallest value)).
        vmax: Value mapped to the last colour (default: the largest value).
        cmap: Colour map stops, see :data:`SURPRISAL_CMAP`.
        legend: Append the colour legend.

    Returns:
        A self-contained HTML fragment (a ``<style>`` block and a ``div``).

    Raises:
        ValueError: The sequences differ in length, or the colour map is malformed.
    """
    n = len(tokens)
    vals = np.asarray(values, dtype=np.float64).reshape(-1)
    if vals.shape[0] != n:
        raise ValueError(f"got {n} tokens but {vals.shape[0]} values; give one value per token")
    if labels is not None and len(labels) != n:
        raise ValueError(f"got {n} tokens but {len(labels)} labels; give one label per token")
    if positions is not None and len(positions) != n:
        raise ValueError(f"got {n} tokens but {len(positions)} positions")
    _check_cmap(cmap)
    finite = vals[np.isfinite(vals)]
    lo = float(vmin) if vmin is not None else min(0.0, float(finite.min()) if finite.size else 0.0)
    hi = float(vmax) if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    if hi <= lo:
        hi = lo + 1.0
    pos = list(positions) if positions is not None else list(range(n))
    spans: list[str] = []
    for j, tok in enumerate(tokens):
        v = float(vals[j])
        bg = interpolate_color((v - lo) / (hi - lo), cmap) if math.isfinite(v) else NAN_COLOR
        fg = text_color(bg)
        gold = labels is not None and int(labels[j]) == 1
        title = [f"token: {tok!r}", f"position: {pos[j]}", f"{value_name}: {_format_value(v)}"]
        if labels is not None:
            title.append(f"gold: {'hallucinated' if gold else 'faithful'}")
        title_attr = html.escape("\n".join(title), quote=True).replace("\n", "&#10;")
        cls = "rs-tok rs-gold" if gold else "rs-tok"
        spans.append(
            f'<span class="{cls}" data-pos="{pos[j]}" style="background-color: {bg}; '
            f'color: {fg};" title="{title_attr}">{visible_token(tok)}</span>'
        )
    body = "".join(spans)
    out = [_CSS, '<div class="rs-heatmap-wrap">', f'<div class="rs-heatmap">{body}</div>']
    if legend:
        out.append(
            legend_html(lo, hi, value_name=value_name, cmap=cmap, show_gold=labels is not None)
        )
    out.append("</div>")
    return "".join(out)


ADAPT_BELOW = 0.5
"""A detector's token colours run from 0 to the answer's own highest score when that is
below this (else from 0 to 1): low scores on a fixed 0-1 scale leave the answer white."""


@dataclass(frozen=True)
class TokenScale:
    """The colour scale of a detector's token scores on one answer, and what it is.

    Attributes:
        vmin: The score drawn lightest.
        vmax: The score drawn darkest.
        note: The scale and the flags in words (Markdown), for the caption.
    """

    vmin: float
    vmax: float
    note: str


def detector_scale(scores: np.ndarray, threshold: float, *, fixed: bool = False) -> TokenScale:
    """The scale for ``scores`` (a detector's token scores in [0, 1]): 0 to 1 when
    ``fixed`` or when some token reaches :data:`ADAPT_BELOW`, else 0 to this answer's
    highest score or the token ``threshold``, whichever is higher, said in :attr:`TokenScale.note` with how many tokens reach the
    detector's token ``threshold``."""
    finite = scores[np.isfinite(scores)] if scores.size else scores
    top = float(finite.max()) if finite.size else 0.0
    n = int(token_flags(finite, threshold).sum())
    flags = (
        f"{n} token{'' if n == 1 else 's'} reach{'es' if n == 1 else ''} its token "
        f"threshold {threshold:.3f}"
        if n
        else f"no token reaches its token threshold {threshold:.3f}"
    )
    # Down to the token threshold, never below it: a scale stretched to a highest score of
    # 0.0003 would paint noise as dark as a flag.
    vmax = max(top, threshold)
    if fixed or vmax >= ADAPT_BELOW or vmax <= 0.0:
        return TokenScale(0.0, 1.0, f"Scale: fixed, 0 to 1; {flags}.")
    return TokenScale(
        0.0,
        vmax,
        f"Scale: **0 to {vmax:.3g}**, the higher of this answer's highest score "
        f"({top:.3g}) and the token threshold, not 0 to 1 (every score here is low; "
        f"*Fixed 0–1 scale* draws them on the full range); {flags}.",
    )


def render_token_heatmap(
    tokens: Sequence[str],
    values: Sequence[float] | np.ndarray,
    **kwargs: object,
) -> str:
    """Show :func:`token_heatmap_html` on the page (``st.html``) and return the HTML.

    Args:
        tokens: Token texts.
        values: One value per token.
        **kwargs: Passed on to :func:`token_heatmap_html`.
    """
    import streamlit as st

    body = token_heatmap_html(tokens, values, **kwargs)  # type: ignore[arg-type]
    st.html(body)
    return body
