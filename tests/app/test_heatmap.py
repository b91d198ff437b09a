"""The token heatmap HTML: escaping, hover titles, gold marks, colours, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.components.heatmap import (
    ADAPT_BELOW,
    SURPRISAL_CMAP,
    detector_scale,
    interpolate_color,
    text_color,
    token_heatmap_html,
)


def test_token_text_is_escaped_never_raw() -> None:
    out = token_heatmap_html(["<script>", "alert(1)", "</script>", ' "x" & y'], [1, 2, 3, 4])
    assert "<script>" not in out
    assert "</script>" not in out
    assert "&lt;script&gt;" in out
    assert "&lt;/script&gt;" in out
    assert "&amp; y" in out


def test_title_holds_token_position_value_and_gold() -> None:
    out = token_heatmap_html(["Paris", " <b>"], [0.5, 12.345], labels=[0, 1], positions=[40, 41])
    titles = re.findall(r'title="([^"]*)"', out)
    assert len(titles) == 2
    assert "token: &#x27;Paris&#x27;" in titles[0]
    assert "position: 40" in titles[0]
    assert "surprisal (bits): 0.50" in titles[0]
    assert "gold: faithful" in titles[0]
    # The second token's repr is escaped inside the attribute, and its value rounded.
    assert "token: &#x27; &lt;b&gt;&#x27;" in titles[1]
    assert "position: 41" in titles[1]
    assert "surprisal (bits): 12.35" in titles[1]
    assert "gold: hallucinated" in titles[1]


def test_no_gold_line_without_labels() -> None:
    out = token_heatmap_html(["a", "b"], [1.0, 2.0])
    assert "gold:" not in out
    assert "rs-gold" not in out.split("</style>", 1)[1]


def test_gold_mark_only_on_labelled_tokens() -> None:
    out = token_heatmap_html(["a", "b", "c", "d"], [1, 2, 3, 4], labels=[0, 1, 1, 0])
    body = out.split("</style>", 1)[1]
    classes = re.findall(r'<span class="(rs-tok[^"]*)" data-pos="(\d+)"', body)
    assert classes == [
        ("rs-tok", "0"),
        ("rs-tok rs-gold", "1"),
        ("rs-tok rs-gold", "2"),
        ("rs-tok", "3"),
    ]
    assert "gold hallucination span" in body  # the legend explains the mark


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"values": [1.0]}, "values"),
        ({"values": [1.0, 2.0], "labels": [1]}, "labels"),
        ({"values": [1.0, 2.0], "positions": [0, 1, 2]}, "positions"),
    ],
)
def test_mismatched_lengths_raise(kwargs: dict, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        token_heatmap_html(["a", "b"], **kwargs)


def test_whitespace_is_visible() -> None:
    out = token_heatmap_html(["Hello", "\n\n", "  world", "\t"], [1, 2, 3, 4])
    body = out.split("</style>", 1)[1]
    assert body.count("↵") == 2
    assert body.count("<br>") == 2
    assert ">  world</span>" in body  # leading spaces kept (pre-wrap container)
    assert "⇥" in body
    assert "white-space: pre-wrap" in out


def test_colours_follow_values_and_text_stays_readable() -> None:
    out = token_heatmap_html(["lo", "hi"], [0.0, 10.0], vmin=0.0, vmax=10.0)
    bgs = re.findall(r"background-color: (#[0-9a-f]{6}); color: (#[0-9a-f]{6})", out)
    assert bgs[0] == (SURPRISAL_CMAP[0][1], "#111111")  # white background, dark text
    assert bgs[1][0] == SURPRISAL_CMAP[-1][1]
    assert bgs[1][1] == "#ffffff"  # dark red background, white text
    assert "0.00" in out and "10.00" in out  # legend range


def test_interpolation_is_linear_between_stops() -> None:
    cmap = ((0.0, "#000000"), (1.0, "#ffffff"))
    assert interpolate_color(0.5, cmap) == "#808080"
    assert interpolate_color(-3.0, cmap) == "#000000"
    assert interpolate_color(7.0, cmap) == "#ffffff"
    assert text_color("#000000") == "#ffffff"
    assert text_color("#ffffff") == "#111111"


def test_nan_values_are_grey_and_say_so() -> None:
    out = token_heatmap_html(["a", "b"], [float("nan"), 1.0])
    assert "surprisal (bits): n/a" in out
    assert "#e0e0e0" in out


def test_bad_colour_map_raises() -> None:
    with pytest.raises(ValueError, match="stops"):
        token_heatmap_html(["a"], [1.0], cmap=((0.0, "#ffffff"), (0.5, "#000000")))


def test_a_detectors_scale_adapts_to_low_scores_and_says_so() -> None:
    low = np.asarray([0.01, 0.04, np.nan, 0.02])
    scale = detector_scale(low, 0.03)
    assert (scale.vmin, scale.vmax) == (0.0, 0.04)
    assert "0 to 0.04**, the higher of this answer's highest score (0.04)" in scale.note
    assert "1 token reaches its token threshold 0.030" in scale.note
    # Never below the threshold: scores far under it stay pale, not painted as flags.
    faint = detector_scale(np.asarray([0.0001, 0.0003]), 0.3)
    assert faint.vmax == 0.3 and "no token reaches its token threshold 0.300" in faint.note
    fixed = detector_scale(low, 0.03, fixed=True)
    assert (fixed.vmin, fixed.vmax) == (0.0, 1.0) and fixed.note.startswith("Scale: fixed")
    high = detector_scale(np.asarray([0.2, ADAPT_BELOW, 0.9]), 0.8)
    assert high.vmax == 1.0 and "1 token reaches its token threshold 0.800" in high.note
    assert detector_scale(np.asarray([]), 0.5).vmax == 1.0
